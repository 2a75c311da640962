#!/usr/bin/env python3
"""Compile every fused Triton kernel variant for Hopper (sm_90a) on a machine without a GPU,
and gate its code quality: registers, spills, shared memory, tensor-core bound.

    python benchmarks/gpu/compile_check.py OUT.json [--head-dim 64 128] [--no-float32]
        [--dtype float16 bfloat16 float32] [--kernel NAME ...] [--jobs N]

Variants come from the launchers themselves, at run time: every ``@triton.jit`` kernel that
a module of ``taylorshift.ops.triton`` launches (``NAME[grid](...)`` in its source) is
replaced by a recorder, and the launchers are driven on small CPU tensors (``drive``):
the non-causal efficient form forward and backward with and without a key mask, the
causal efficient form with and without a state in and out, the direct form causal or not,
with and without a key mask, forward and backward; float16 and bfloat16 at d = dv = each
--head-dim, float32 at the largest (exact "ieee" and, with TF32 allowed, "tf32": one variant
per kernel and mode, as their exact dots compile slowly). Each launch is bound and
specialised by Triton's own binder for ``GPUTarget("cuda", 90, 32)`` (argument types,
divisibility by 16, integers equal to 1), as a launch on an H100/H200 would be, and every
distinct (kernel, signature, constexprs, options) is compiled with ``triton.compile``.

For each variant: the PTX target (sm_90a), registers and spill bytes from ``ptxas -v``
(the ptxas Triton uses for sm_90, the newest its wheel ships), shared memory
(``metadata.shared``), the count of wgmma instructions, and the tensor-core bound of the
hot loop (``hot_block``): in the basic block of the SASS (nvdisasm from the wheel; the PTX
where it is missing) that holds the most wgmma, the tensor-core cycles of its wgmma
(m64nNk16 in 16 bits: N/2 cycles of an SM's tensor cores) against the instructions one
warp issues there (one each, wgmma included):

    bound = tc_cycles / max(tc_cycles, issued)       in [0, 1]

an upper bound on the time the tensor cores can be busy (README.md, "The static gate").

Exit status 1 when a variant fails to compile, needs more shared memory than sm_90 has
(227 KiB a block), or when a 16-bit variant that uses the tensor cores (wgmma > 0)
spills or has a bound under 0.5 and its (kernel, dtype, d) is not in KNOWN_BELOW_BAR;
also when a listed (kernel, dtype, d) now meets the bar or no longer exists (the list must
stay true), and when a launched kernel was never recorded (``drive`` must reach it).
``benchmarks/gpu/run --dry-run`` runs this as a step (CI runs the dry run).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SM90_SHARED = 227 * 1024  # bytes per block
SM80_SHARED = 163 * 1024
BAR = 0.5  # the least tensor-core bound a 16-bit tensor-core variant may have
HEAD_DIMS = (64, 128)
SIXTEEN_BIT = ("float16", "bfloat16")
DTYPES = (*SIXTEEN_BIT, "float32")

# (kernel, dtype, d) with 16-bit tensor-core variants below the bar (spills or bound < 0.5)
# while the kernels are rebuilt: their misses are reported as "known below the bar" and
# pass. An entry whose variants all meet the bar fails the check until it is removed. Each
# says what the variants that miss had when the entry was made (2026-12-01, Triton 3.9,
# ptxas 13.4; the efficient kernels part-way through their rewrite).
KNOWN_BELOW_BAR: dict[tuple[str, str, int], str] = {
    ("_apply_kernel", "bfloat16", 128): "causal (fp32 state operands): spills 48 B",
    ("_apply_kernel", "float16", 128): "causal (fp32 state operands): spills 48 B",
    ("_direct_bwd_dkv_kernel", "bfloat16", 64): "HAS_MASK IS_CAUSAL: bound 0.49",
    ("_direct_bwd_dkv_kernel", "bfloat16", 128): "bound 0.24-0.31 (8 warps, 64 x 32 tiles)",
    ("_direct_bwd_dkv_kernel", "float16", 128): "bound 0.25-0.32 (8 warps, 64 x 32 tiles)",
    ("_direct_fwd_kernel", "bfloat16", 64): "HAS_MASK IS_CAUSAL: bound 0.47",
    ("_direct_fwd_kernel", "float16", 64): "HAS_MASK IS_CAUSAL: bound 0.47",
    ("_grad_kernel", "bfloat16", 64): "bound 0.33-0.38",
    ("_grad_kernel", "bfloat16", 128): "bound 0.43-0.49, spills 4 B (R_MODE=2)",
    ("_grad_kernel", "float16", 64): "bound 0.33-0.38",
    ("_grad_kernel", "float16", 128): "bound 0.43-0.49, spills 4 B (R_MODE=2)",
    ("_state_kernel", "bfloat16", 64): "bound 0.31-0.37",
    ("_state_kernel", "bfloat16", 128): "bound 0.31-0.37",
    ("_state_kernel", "float16", 64): "bound 0.32-0.37",
    ("_state_kernel", "float16", 128): "bound 0.32-0.37",
}


# Parsing: ptxas -v, and the basic blocks of SASS or PTX


def parse_ptxas(log: str) -> dict:
    """Registers (the most any function uses), spill stores, spill loads and stack frame
    bytes (summed over functions) from ``ptxas -v``'s output; ValueError without a
    register count."""
    regs = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    if not regs:
        raise ValueError(f"no 'Used N registers' in ptxas output: {log[-500:]!r}")

    def total(pattern: str) -> int:
        return sum(int(n) for n in re.findall(pattern, log))

    return {
        "registers": max(regs),
        "spill_stores": total(r"(\d+) bytes spill stores"),
        "spill_loads": total(r"(\d+) bytes spill loads"),
        "stack_frame": total(r"(\d+) bytes stack frame"),
    }


@dataclass
class Block:
    """A basic block: its first label (or None) and its instructions (opcode and operands,
    predicate dropped)."""

    label: str | None
    instructions: list[str] = field(default_factory=list)


# SASS (nvdisasm -c): "        /*0950*/                   I2FP.F32.U32 R6, UR5 ;"
_SASS_INSTR = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*([.$\w]+):")
_PREDICATE = re.compile(r"^@!?[%\w]+\s+")
_SASS_ENDS = {"BRA", "BRX", "JMP", "JMX", "RET", "EXIT", "KILL"}
_PTX_ENDS = {"bra", "brx", "ret", "exit", "trap"}
# A 16-bit wgmma m64nNk16 (1,024·N FMA) keeps an SM's four tensor cores busy N/2 cycles
# (H100: 2,048 dense bf16 FMA a cycle an SM); the K of one instruction is the native K of its
# input type (k8 for tf32 at half the rate, k32 for 8 bits at twice it): N/2 cycles too.
_SASS_MMA = re.compile(r"^[HIQO]GMMA\.(\d+)x(\d+)x(\d+)")
_PTX_MMA = re.compile(r"^wgmma\.mma_async(?:\.sp)?\.sync\.aligned\.m(\d+)n(\d+)k(\d+)")
_NATIVE_K = {"tf32": 8, "f16": 16, "bf16": 16, "e4m3": 32, "e5m2": 32, "s8": 32, "u8": 32}


def basic_blocks(asm: str, kind: str) -> list[Block]:
    """``asm`` (``kind`` "sass", nvdisasm -c output, or "ptx") cut into basic blocks: a new
    block starts at a label that a branch names and after a branch, return or exit. PTX
    directives (``.reg``, ``.loc``, ...), comments and braces are not instructions."""
    lines = []  # ("label", name) or ("instr", text)
    for raw in asm.splitlines():
        line = raw.split("//", 1)[0] if kind == "ptx" else raw
        match = _LABEL.match(line)
        if match and not _SASS_INSTR.match(line):
            lines.append(("label", match.group(1)))
            continue
        if kind == "sass":
            found = _SASS_INSTR.match(line)
            if found:
                lines.append(("instr", _PREDICATE.sub("", found.group(1))))
        else:
            text = line.strip()
            if text.endswith(";") and not text.startswith((".", "{", "}")):
                lines.append(("instr", _PREDICATE.sub("", text[:-1].strip())))
    ends = _SASS_ENDS if kind == "sass" else _PTX_ENDS
    targets = set()
    for what, text in lines:
        if what == "instr" and _opcode(text).split(".")[0] in ends:
            targets.update(re.findall(r"[.$\w]+", text.split(None, 1)[1] if " " in text else ""))
    blocks = [Block(None)]
    for what, text in lines:
        if what == "label":
            if text in targets:
                if blocks[-1].instructions or blocks[-1].label is not None:
                    blocks.append(Block(text))
                else:
                    blocks[-1].label = text
            continue
        blocks[-1].instructions.append(text)
        if _opcode(text).split(".")[0] in ends:
            blocks.append(Block(None))
    return [b for b in blocks if b.instructions]


def _opcode(instruction: str) -> str:
    return instruction.split(None, 1)[0] if instruction else ""


def mma_cycles(instruction: str, kind: str) -> float | None:
    """Tensor-core cycles of one SM for a wgmma instruction (N/2 for m64nNk of the input
    type's native K, scaled by K / native K), or None when it is not a wgmma."""
    op = _opcode(instruction)
    match = (_SASS_MMA if kind == "sass" else _PTX_MMA).match(op)
    if not match:
        return None
    m, n, k = (int(x) for x in match.groups())
    # the input type: HGMMA.64x64x16.F32.BF16, wgmma...m64n64k16.f32.bf16.bf16 -> bf16
    native = _NATIVE_K.get(op.split(".")[-1].lower(), 16)
    return (m / 64) * (n / 2) * (k / native)


def hot_block(asm: str, kind: str) -> dict:
    """The tensor-core bound of ``asm``'s hot loop: the basic block with the most wgmma
    (ties: the most tensor-core cycles). Returns the kernel's wgmma count, the block's
    wgmma, tensor-core cycles, instructions one warp issues there (wgmma included: each
    takes an issue slot of its warp's scheduler) and ``bound = tc / max(tc, issued)``
    (None without wgmma).

    Why per warp: a warp group's four warps sit on the SM's four schedulers, each issuing
    one instruction a cycle, and each warp issues every instruction of the block, its
    share of each wgmma included; the wgmma of the group keeps all four tensor cores
    busy N/2 cycles. More warp groups or blocks per SM add to both sides alike.
    """
    blocks = basic_blocks(asm, kind)
    total, best = 0, None
    for block in blocks:
        cycles = [c for c in (mma_cycles(i, kind) for i in block.instructions) if c is not None]
        total += len(cycles)
        score = (len(cycles), sum(cycles))
        if cycles and (best is None or score > best[0]):
            best = (score, block, sum(cycles))
    if best is None:
        return {"wgmma": 0, "hot_wgmma": 0, "tc_cycles": 0, "issued": 0, "bound": None,
                "hot_label": None}  # fmt: skip
    (count, _), block, tc = best
    issued = len(block.instructions)
    return {"wgmma": total, "hot_wgmma": count, "tc_cycles": tc, "issued": issued,
            "bound": round(tc / max(tc, issued), 3), "hot_label": block.label}  # fmt: skip


# Verdicts


def misses(row: dict) -> list[str]:
    """Why a 16-bit tensor-core variant misses the bar (empty: it meets it, or the bar does
    not apply: float32, no wgmma, or no compiled result)."""
    if row.get("error") or row["dtype"] not in SIXTEEN_BIT or not row.get("wgmma"):
        return []
    why = []
    if row["spill_stores"] or row["spill_loads"]:
        why.append(f"spills {row['spill_stores']}/{row['spill_loads']} B")
    if row["bound"] is not None and row["bound"] < BAR:
        why.append(f"bound {row['bound']:.3f} < {BAR}")
    return why


def judge(rows: list[dict], known: dict, checked: Iterable[tuple[str, int]]) -> list[str]:
    """Sets each row's ``verdict`` and ``failed``; returns the failures, one line each, with
    the KNOWN_BELOW_BAR entries that match no 16-bit tensor-core variant. ``checked``: the
    (dtype, d) this run compiled, the only ones whose list entries it can judge.

    A (kernel, dtype, d) on the list is known below the bar while one of its variants
    misses it; when all its 16-bit tensor-core variants meet it, every one of them fails
    with "now meets the bar": the entry must go.
    """
    failures = []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["kernel"], row["dtype"], row["d"])].append(row)
    for key, members in groups.items():
        listed = key in known
        gated = [r for r in members if _gated(r)]
        all_meet = bool(gated) and not any(misses(r) for r in gated)
        for row in members:
            why = misses(row)
            row["failed"] = False
            if row.get("error"):
                row["verdict"] = "FAILED: " + row["error"].splitlines()[0][:100]
                row["failed"] = True
            elif row["shared_bytes"] > SM90_SHARED:
                row["verdict"], row["failed"] = "FAILED: shared memory over sm_90's", True
            elif why and listed:
                row["verdict"] = "known below the bar (" + ", ".join(why) + ")"
            elif why:
                row["verdict"], row["failed"] = "FAILED: " + ", ".join(why), True
            elif listed and all_meet:
                row["verdict"] = "FAILED: now meets the bar: remove it from KNOWN_BELOW_BAR"
                row["failed"] = True
            elif _gated(row):
                row["verdict"] = "meets the bar"
            elif row["dtype"] in SIXTEEN_BIT:
                sync = f"{row['ptx_mma_sync']} mma.sync, " if row.get("ptx_mma_sync") else ""
                row["verdict"] = f"ok (no wgmma: {sync}not gated)"
            else:
                row["verdict"] = "ok (float32: not gated)"
            if row["failed"]:
                failures.append(f"{_name(row)}: {row['verdict']}")
    checked = set(checked)
    for key in known:
        if (key[1], key[2]) in checked and not any(_gated(r) for r in groups.get(key, [])):
            failures.append(f"KNOWN_BELOW_BAR {key}: no such 16-bit tensor-core variant: "
                            "remove it")  # fmt: skip
    return failures


def _gated(row: dict) -> bool:
    """A compiled 16-bit variant with wgmma: the bar applies."""
    return not row.get("error") and row["dtype"] in SIXTEEN_BIT and bool(row.get("wgmma"))


def _name(row: dict) -> str:
    flags = f" [{row['flags']}]" if row.get("flags") else ""
    return f"{row['kernel']} {row['dtype']} d={row['d']}{flags}"


# Recording the launches


@dataclass
class Variant:
    """One launch, bound as Triton would bind it for sm_90a."""

    fn: object  # the JITFunction
    family: str  # which drive launched it
    dtype: str
    d: int
    mode: str  # float32: "ieee" or "tf32"; 16-bit: the dtype
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    approximate: bool = False  # bound without Triton's binder (older/newer Triton)

    @property
    def name(self) -> str:
        return self.fn.__name__

    def params(self) -> tuple[dict[str, str], dict[str, str]]:
        """(the kernel's constexpr arguments and their values, every other argument's type
        or, where Triton specialised it to a constant (an integer equal to 1), its value)."""
        names = list(self.fn.arg_names)
        declared = {p.name for p in self.fn.params if p.is_constexpr}
        constexprs, args = {}, {k: str(v) for k, v in self.signature.items() if v != "constexpr"}
        for path, value in self.constexprs.items():
            name = names[path[0]] if isinstance(path, tuple) else path
            (constexprs if name in declared else args)[name] = str(value)
        return constexprs, args


def _binder(target):
    """A function (fn, args, kwargs) -> (signature, constexprs, attrs, options, approximate):
    Triton's own binding for ``target`` where this Triton has it, else types alone."""
    try:
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        backend = make_backend(target)
    except (ImportError, AttributeError):  # pragma: no cover - another Triton
        backend = None

    binders: dict = {}

    def bind(fn, args, kwargs):
        if backend is not None and hasattr(fn, "_pack_args"):
            if fn not in binders:
                binders[fn] = create_function_from_signature(fn.signature, fn.params, backend)
            binder = binders[fn]
            bound, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = fn._pack_args(
                backend, kwargs, bound, specialization, options
            )
            return signature, constexprs, attrs, dict(options.__dict__), False
        return (*_bind_by_type(fn, args, kwargs), True)

    return bind


def _bind_by_type(fn, args, kwargs):  # pragma: no cover - used only without Triton's binder
    import torch

    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    types = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
             torch.int32: "i32", torch.uint8: "u8", torch.bool: "i1"}  # fmt: skip
    signature, constexprs = {}, {}
    padded = list(args) + [None] * (len(fn.arg_names) - len(args))
    for i, (name, value) in enumerate(zip(fn.arg_names, padded, strict=True)):
        if name in kwargs:
            constexprs[(i,)] = kwargs[name]
            signature[name] = "constexpr"
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + types[value.dtype]
        else:
            signature[name] = "i64"
    return signature, constexprs, {}, options


def launched_kernels(modules) -> dict[str, list[tuple[object, str]]]:
    """module -> [(its JITFunction, attribute name)] for every kernel the module launches
    (``NAME[`` in its source: ``kernel[grid](...)``)."""
    import inspect

    from triton.runtime.jit import JITFunction

    found = {}
    for module in modules:
        source = inspect.getsource(module)
        found[module.__name__] = [
            (value, name) for name, value in vars(module).items()
            if isinstance(value, JITFunction) and re.search(rf"\b{re.escape(name)}\[", source)
        ]  # fmt: skip
    return found


def kernel_modules():
    """Every module of ``taylorshift.ops.triton`` (the package's files, at run time)."""
    import importlib
    import pkgutil

    package = importlib.import_module("taylorshift.ops.triton")
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__))
    return [importlib.import_module(f"taylorshift.ops.triton.{n}") for n in names]


@contextlib.contextmanager
def recording(modules, target, into: dict, context: dict) -> Iterator[list]:
    """Replaces every launched kernel by a recorder for the ``with`` block; each launch
    adds its Variant to ``into`` (one per kernel, float32 mode and d for float32; else one
    per binding), tagged with ``context`` (family, dtype, d, mode) as it is then. Yields
    the (module, name) of the kernels replaced."""
    bind = _binder(target)

    class Recorder:
        """Stands in for a jitted kernel: ``kernel[grid](*args, **kwargs)`` records."""

        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                signature, constexprs, attrs, options, approx = bind(self.fn, args, kwargs)
                variant = Variant(self.fn, context["family"], context["dtype"], context["d"],
                                  context["mode"], signature, constexprs, attrs, options,
                                  approx)  # fmt: skip
                if context["dtype"] == "float32":
                    # exact float32 dots take 20-100 s each to compile: one variant per
                    # kernel, float32 mode and d (the flags that differ do not change them)
                    key = (variant.name, "float32", context["mode"], context["d"])
                else:
                    constexprs, types = variant.params()
                    key = (variant.name, tuple(sorted(constexprs.items())),
                           tuple(sorted(types.items())), str(attrs),
                           str(sorted(options.items())))  # fmt: skip
                into.setdefault(key, variant)

            return launch

    swapped = []
    try:
        for module, kernels in launched_kernels(modules).items():
            for fn, name in kernels:
                setattr(sys.modules[module], name, Recorder(fn))
                swapped.append((module, name, fn))
        yield [(m, n) for m, n, _ in swapped]
    finally:
        for module, name, fn in swapped:
            setattr(sys.modules[module], name, fn)


def drive(head_dims, dtypes, context: dict) -> list[str]:
    """Runs the launchers on CPU tensors (the kernels replaced by recorders: nothing is
    computed) in every combination the router can send them; returns one line per family
    whose launchers raised (their signatures changed: update this function)."""
    import torch

    from taylorshift.ops.triton import direct as td
    from taylorshift.ops.triton import efficient as te
    from taylorshift.ops.triton import efficient_causal as tc

    # H > 1 and N % 16 == 0, as in most real calls (Triton specialises integers equal to 1
    # and divisible by 16); the causal form pads N to its chunk
    b, h, n = 1, 2, 64

    def efficient(dtype, d):
        q, k = (torch.zeros(b, h, n, d) for _ in range(2))
        v = torch.zeros(b, h, n, d, dtype=dtype)
        for mask, normalize in ((None, True), (torch.ones(b, h, n, dtype=torch.bool), True),
                                (None, False)):  # fmt: skip
            out, den, state = te.triton_efficient_forward(q, k, v, mask, normalize)
            te.triton_efficient_backward(out.float(), q, k, v, mask, out, den, state, normalize)

    def causal(dtype, d):
        q, k = (torch.zeros(b * h, n, d) for _ in range(2))
        u = torch.zeros(b * h, n, d + 1)
        dot = te.dot_kind(dtype)
        size = te.layout(d, d).size
        for initial, final in ((None, False), (torch.zeros(b * h, size), True)):
            tc.triton_causal_forward(q, k, u, initial, tc.DEFAULT_CHUNK, 1, dot, final)
            tc.triton_causal_backward(u.clone(), q, k, u, initial, tc.DEFAULT_CHUNK, 1, dot)

    def direct(dtype, d):
        q, k, v = (torch.zeros(b, h, n, d, dtype=dtype) for _ in range(3))
        f = torch.ones(b, h, n)
        kmax = torch.ones(b, h)
        padding = torch.ones(b, 1, 1, n, dtype=torch.bool).expand(b, h, 1, n)[:, :, 0]
        for mask in (None, padding):
            for is_causal in (False, True):
                out, rinv = td._forward_op(q, k, v, f, mask, kmax, is_causal)
                td._backward_op(out, q, k, v, f, mask, out, rinv, is_causal)

    families: dict[str, Callable] = {"efficient": efficient, "causal": causal, "direct": direct}
    errors = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for dtype in dtypes:
            modes = ("ieee", "tf32") if dtype == torch.float32 else (None,)
            for mode in modes:
                torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
                # float32 at the largest d alone: its shared memory grows with d, and its
                # exact dots take 20-100 s a variant to compile
                for d in [max(head_dims)] if dtype == torch.float32 else head_dims:
                    for family, run in families.items():
                        name = str(dtype).replace("torch.", "")
                        context.update(family=family, dtype=name, d=d, mode=mode or name)
                        try:
                            run(dtype, d)
                        except Exception as err:  # a launcher whose signature changed
                            errors.append(f"drive {family} {name} d={d}: "
                                          f"{type(err).__name__}: {err}"[:500])  # fmt: skip
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return errors


# Compiling and measuring one variant


def tools() -> dict:
    """Paths of the wheel's ptxas (Triton's for sm_90: the newest it ships) and nvdisasm
    (None where missing), and the ptxas version."""
    from triton import knobs

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(90).path
    except (ImportError, AttributeError):  # pragma: no cover - another Triton
        ptxas = knobs.nvidia.ptxas.path
    try:
        nvdisasm = knobs.nvidia.nvdisasm.path
    except AttributeError:  # pragma: no cover - no nvdisasm in the wheel
        nvdisasm = None
    nvdisasm = nvdisasm if nvdisasm and os.path.exists(nvdisasm) else shutil.which("nvdisasm")
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release ([\d.]+), V([\d.]+)", version)
    return {"ptxas": ptxas, "ptxas_version": match.group(2) if match else version.strip(),
            "nvdisasm": nvdisasm}  # fmt: skip


def measure(compiled, tool: dict, ptxas_log: str = "") -> dict:
    """ptxas -v, SASS (or PTX) hot block and shared memory of a ``triton.compile`` result;
    ``ptxas_log``: the log of the ptxas run that built its cubin, if captured (else ptxas
    runs again on its PTX with Triton's flags)."""
    ptx = compiled.asm["ptx"]
    target = re.search(r"^\s*\.target\s+(\S+)", ptx, re.M)
    result = {"ptx_target": target.group(1) if target else None,
              "shared_bytes": compiled.metadata.shared,
              "fits_sm80": compiled.metadata.shared <= SM80_SHARED,
              "ptx_wgmma": len(re.findall(r"\bwgmma\.mma_async\b", ptx)),
              "ptx_mma_sync": len(re.findall(r"\bmma\.sync\b", ptx))}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        result["ptxas_run"] = "compile" if "Used" in ptxas_log else "again"
        if result["ptxas_run"] == "compile":
            cubin.write_bytes(compiled.asm["cubin"])
        else:  # a kernel from Triton's cache: no ptxas ran
            src.write_text(ptx)
            # Triton's own ptxas flags for sm_90 (backends/nvidia/compiler.py, make_cubin)
            done = subprocess.run(
                [tool["ptxas"], "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a", str(src),
                 "-o", str(cubin)], capture_output=True, text=True, check=True,
            )  # fmt: skip
            ptxas_log = done.stdout + done.stderr
        result.update(parse_ptxas(ptxas_log))
        kind, asm = "ptx", ptx
        if tool["nvdisasm"]:
            sass = subprocess.run([tool["nvdisasm"], "-c", str(cubin)], capture_output=True,
                                  text=True)  # fmt: skip
            if sass.returncode == 0 and sass.stdout.strip():
                kind, asm = "sass", sass.stdout
    result.update(hot_block(asm, kind), bound_from=kind)
    return result


@contextlib.contextmanager
def ptxas_log() -> Iterator[io.StringIO]:
    """Captures the ``ptxas -v`` log of the compiles in the block (Triton prints it with
    TRITON_DUMP_PTXAS_LOG), so that ptxas need not run twice."""
    from triton import knobs

    before = knobs.nvidia.dump_ptxas_log
    knobs.nvidia.dump_ptxas_log = True
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield buffer
    finally:
        knobs.nvidia.dump_ptxas_log = before


def compile_one(variant: Variant, tool: dict) -> dict:
    """Compiles ``variant`` for sm_90a and measures it; an error is the finding."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    row = {"kernel": variant.name, "family": variant.family, "dtype": variant.dtype,
           "d": variant.d, "mode": variant.mode, "constexprs": variant.params()[0],
           "args": variant.params()[1],
           "options": {k: variant.options.get(k) for k in ("num_warps", "num_stages")},
           "approximate_binding": variant.approximate}  # fmt: skip
    start = time.monotonic()
    try:
        with ptxas_log() as log:
            compiled = triton.compile(
                ASTSource(fn=variant.fn, signature=variant.signature,
                          constexprs=variant.constexprs, attrs=variant.attrs),
                target=GPUTarget("cuda", 90, 32), options=variant.options,
            )  # fmt: skip
        row.update(measure(compiled, tool, log.getvalue()))
        if row["ptx_target"] != "sm_90a":
            row["error"] = f"PTX target {row['ptx_target']}, not sm_90a"
    except Exception as err:  # a variant that does not compile is the finding
        row["error"] = f"{type(err).__name__}: {err}"[-1500:]
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


_POOL_VARIANTS: list[Variant] = []
_POOL_TOOL: dict = {}


def _compile_index(i: int) -> dict:
    return compile_one(_POOL_VARIANTS[i], _POOL_TOOL)


def compile_all(variants: list[Variant], tool: dict, jobs: int, log: Callable) -> list[dict]:
    """Compiles every variant, ``jobs`` at a time (forked workers: the variants' kernels
    are in their memory already); ``log`` gets each row as it is done."""
    if jobs <= 1 or len(variants) <= 1:
        rows = []
        for v in variants:
            rows.append(compile_one(v, tool))
            log(rows[-1])
        return rows
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    _POOL_VARIANTS[:] = variants
    _POOL_TOOL.update(tool)
    rows: list[dict | None] = [None] * len(variants)
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        # the slow float32 compiles first, so that they do not end the run alone
        order = sorted(range(len(variants)), key=lambda i: variants[i].dtype != "float32")
        for i, row in zip(order, pool.map(_compile_index, order), strict=True):
            rows[i] = row
            log(row)
    return [r for r in rows if r is not None]


# The table


def set_flags(rows: list[dict]) -> None:
    """``flags``: what tells apart the variants of one (kernel, dtype, d): the constexprs
    whose values differ (``NAME`` for a true boolean, absent when false, ``NAME=value``
    otherwise), the form that launched it where several forms launch the kernel, and,
    between variants alike in those, the argument types that differ (``s_ptr=*fp32``);
    float32 variants start with their mode (ieee, tf32)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["kernel"], row["dtype"], row["d"])].append(row)
    for members in groups.values():
        forms = len({m["family"] for m in members}) > 1
        for row in members:
            parts = [row["mode"]] if row["dtype"] == "float32" else []
            parts += [row["family"]] if forms else []
            parts += _differing(members, row, "constexprs")
            row["flags"] = " ".join(parts)
        alike: dict[str, list[dict]] = defaultdict(list)
        for row in members:
            alike[row["flags"]].append(row)
        for same in alike.values():
            for row in same if len(same) > 1 else ():
                row["flags"] = " ".join([row["flags"], *_differing(same, row, "args")]).strip()


def _differing(members: list[dict], row: dict, what: str) -> list[str]:
    parts = []
    for name, value in row[what].items():
        if len({m[what].get(name) for m in members}) == 1 or value == "False":
            continue
        parts.append(name if value == "True" else f"{name}={value}")
    return parts


def table(rows: list[dict]) -> str:
    head = ("kernel", "dtype", "d", "flags", "regs", "spill st/ld", "smem KiB", "wgmma",
            "bound", "verdict")  # fmt: skip
    lines = []
    for r in rows:
        ok = not r.get("error")
        bound = r.get("bound")
        lines.append((
            r["kernel"], r["dtype"], str(r["d"]), r.get("flags", ""),
            str(r["registers"]) if ok else "-",
            f"{r['spill_stores']}/{r['spill_loads']}" if ok else "-",
            f"{r['shared_bytes'] / 1024:.1f}" if ok else "-",
            str(r["wgmma"]) if ok else "-",
            f"{bound:.2f}" if bound is not None else "-",
            r.get("verdict", ""),
        ))  # fmt: skip
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(head)]  # fmt: skip
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*x).rstrip() for x in (head, *lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON file for the variants and their resources")
    parser.add_argument("--head-dim", type=int, nargs="+", default=list(HEAD_DIMS),
                        help="d = dv of the drive (default: 64 128)")  # fmt: skip
    parser.add_argument("--dtype", nargs="+", choices=DTYPES, default=list(DTYPES),
                        help="dtypes of the drive (default: all three)")  # fmt: skip
    parser.add_argument("--no-float32", action="store_true",
                        help="skip float32 (its exact dots compile slowly)")  # fmt: skip
    parser.add_argument("--kernel", nargs="+", help="only the kernels of these names")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="compiles at a time (default: the machine's cores)")  # fmt: skip
    args = parser.parse_args(argv)
    started = time.monotonic()
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silence Triton 3.9's notice
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: TRITON_INTERPRET=1 is set: unset it (kernels are compiled, "
              "not interpreted)", file=sys.stderr)  # fmt: skip
        return 2
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    names = [t for t in args.dtype if not (args.no_float32 and t == "float32")]
    dtypes = [getattr(torch, t) for t in names]
    modules = kernel_modules()
    recorded: dict = {}
    context: dict = {}
    with recording(modules, GPUTarget("cuda", 90, 32), recorded, context) as swapped:
        drive_errors = drive(args.head_dim, dtypes, context)
    variants = [v for v in recorded.values() if not args.kernel or v.name in args.kernel]
    reached = {v.name for v in recorded.values()}
    not_driven = [f"{m}.{n}" for m, n in swapped if n not in reached]
    tool = tools()
    if any(v.approximate for v in variants):
        print("compile_check: this Triton has no binder we know: arguments typed without its "
              "specialisation (integers i64, no divisibility hints)", flush=True)  # fmt: skip
    print(f"compile_check: {len(variants)} variants of {len(reached)} kernels "
          f"(recorded in {time.monotonic() - started:.1f} s); ptxas {tool['ptxas_version']}, "
          f"bound from {'SASS (nvdisasm)' if tool['nvdisasm'] else 'PTX'}; {args.jobs} jobs",
          flush=True)  # fmt: skip

    def log(row: dict) -> None:
        keys = ("kernel", "dtype", "d", "registers", "spill_stores", "shared_bytes", "wgmma",
                "bound", "seconds")  # fmt: skip
        brief = {k: row.get(k) for k in keys}
        if row.get("error"):
            brief["error"] = row["error"][-300:]
        print(json.dumps(brief), flush=True)

    rows = compile_all(variants, tool, args.jobs, log)
    set_flags(rows)
    rows.sort(key=lambda r: (r["kernel"], r["dtype"], r["d"], r["flags"]))
    checked = {(str(t).replace("torch.", ""), d) for t in dtypes for d in args.head_dim}
    known = {k: v for k, v in KNOWN_BELOW_BAR.items() if not args.kernel or k[0] in args.kernel}
    failures = judge(rows, known, checked)
    failures += drive_errors + [f"{k}: launched but never recorded (extend drive())"
                                for k in not_driven]  # fmt: skip
    print()
    print(table(rows))
    bound_from = {r.get("bound_from") for r in rows if r.get("bound_from")}
    print(f"\nbound: tensor-core cycles / max(those, instructions a warp issues) in the "
          f"basic block with the most wgmma, from {', '.join(sorted(bound_from)) or '-'}; "
          f"bar {BAR} and no spills for 16-bit variants with wgmma")  # fmt: skip
    for line in failures:
        print(f"FAIL {line}")
    seconds = round(time.monotonic() - started, 1)
    record = {"target": "cuda sm_90a", "head_dims": args.head_dim, "triton": triton.__version__,
              "ptxas": tool["ptxas_version"], "bound_from": sorted(bound_from), "bar": BAR,
              "known_below_bar": [[*k, why] for k, why in KNOWN_BELOW_BAR.items()],
              "variants": rows,
              "failures": failures, "seconds": seconds,
              "ok": not failures}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(f"{len(rows)} variants in {seconds} s; {'ok' if not failures else 'FAILED'}",
          flush=True)  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
