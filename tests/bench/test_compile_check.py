"""benchmarks/gpu/compile_check.py, the static sm_90a gate: its parsing of ``ptxas -v`` and of
SASS/PTX basic blocks on fixed snippets, its verdicts (spills, bound under 0.5, the
KNOWN_BELOW_BAR list kept true), and its bound on two tiny kernels compiled for sm_90a
here: a loop of one dot (tensor-core bound) and the same dot behind heavy elementwise work
(issue bound)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import triton.language as tl
    from triton.runtime.jit import JITFunction
except ImportError:  # the compiled kernels' tests skip
    tl = JITFunction = None

from tests.helpers import script_module

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "compile_check.py"


@pytest.fixture(scope="module")
def cc():
    with script_module(SCRIPT, "compile_check") as module:
        yield module


PTXAS_SPILLS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_apply_kernel' for 'sm_90a'
ptxas info    : Function properties for _apply_kernel
    1152 bytes stack frame, 1096 bytes spill stores, 1240 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1152 bytes cumulative stack size
"""

PTXAS_CLEAN = """\
ptxas-blackwell info    : Compiling entry function '_k' for 'sm_90a'
ptxas-blackwell info    : Function properties for _k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas-blackwell info    : Used 206 registers, used 1 barriers
"""


def test_ptxas_registers_and_spills(cc):
    assert cc.parse_ptxas(PTXAS_SPILLS) == {
        "registers": 255, "spill_stores": 1096, "spill_loads": 1240, "stack_frame": 1152,
    }  # fmt: skip
    clean = cc.parse_ptxas(PTXAS_CLEAN)
    assert (clean["registers"], clean["spill_stores"], clean["spill_loads"]) == (206, 0, 0)
    with pytest.raises(ValueError, match="Used N registers"):
        cc.parse_ptxas("ptxas fatal   : Unresolved extern function 'foo'")


def _sass(filler: int) -> str:
    """A kernel: a prologue, a loop (.L_x_0) of two m64n128k16 wgmma (64 cycles each) and
    ``filler`` FFMA, a tail with one tf32 wgmma, an exit and the padding loop."""
    ffma = "".join(f"        /*{0x100 + 16 * i:04x}*/   FFMA R{i % 9}, R2, R3, R4 ;\n"
                   for i in range(filler))  # fmt: skip
    return (
        "        .text._k:\n_k:\n"
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
        "        /*0010*/                   S2R R0, SR_TID.X ;\n"
        ".L_x_0:\n"
        "        /*0020*/                   LDG.E R2, desc[UR4][R4.64] ;\n"
        "        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR20], R24 ;\n"
        "        /*0040*/                   HGMMA.64x128x16.F32.BF16 R24, R92, gdesc[UR24], R24 ;\n"
        f"{ffma}"
        "        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
        "        /*0060*/               @P0 BRA `(.L_x_0) ;\n"
        "        /*0070*/                   HGMMA.64x64x8.F32.TF32 R56, R72, gdesc[UR24], RZ ;\n"
        "        /*0080*/               @!P1 EXIT ;\n"
        "        /*0090*/                   EXIT ;\n"
        ".L_x_1:\n"
        "        /*00a0*/                   BRA `(.L_x_1);\n"
        "        /*00b0*/                   NOP;\n"
    )


def test_sass_blocks_split_at_targets_and_branches(cc):
    blocks = cc.basic_blocks(_sass(3), "sass")
    # prologue | loop | tail up to the predicated exit | exit | padding loop | padding
    assert [b.label for b in blocks] == [None, ".L_x_0", None, None, ".L_x_1", None]
    assert [len(b.instructions) for b in blocks] == [2, 8, 2, 1, 1, 1]
    assert blocks[1].instructions[-1] == "BRA `(.L_x_0)"  # the predicate dropped


@pytest.mark.parametrize(
    ("filler", "bound"), [(0, 1.0), (123, 1.0), (251, 0.5), (507, 0.25)],
    ids=["5-issued", "128-issued", "256-issued", "512-issued"],
)  # fmt: skip
def test_sass_hot_block_bound(cc, filler, bound):
    hot = cc.hot_block(_sass(filler), "sass")
    assert (hot["wgmma"], hot["hot_wgmma"], hot["hot_label"]) == (3, 2, ".L_x_0")
    assert hot["tc_cycles"] == 128  # two m64n128k16: 2 · 128/2
    assert hot["issued"] == 5 + filler  # the wgmma take their issue slots too
    assert hot["bound"] == bound


def test_wgmma_cycles_by_shape(cc):
    assert cc.mma_cycles("HGMMA.64x256x16.F32.BF16 R24, R88, gdesc[UR4], R24", "sass") == 128
    assert cc.mma_cycles("HGMMA.64x16x8.F32.TF32 R56, R72, gdesc[UR24], RZ", "sass") == 8
    assert cc.mma_cycles("FFMA R1, R2, R3, R4", "sass") is None
    assert cc.mma_cycles("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%r1}", "ptx") == 32
    assert cc.mma_cycles("wgmma.fence.sync.aligned", "ptx") is None


PTX = """\
.visible .entry _k(
	.param .u64 _k_param_0
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<10>;
	mov.b32 	%r1, 0;
$L__BB0_1:                              // =>This Inner Loop Header: Depth=1
$L__tmp4:
	.loc	1 298 18                        // efficient.py:298:18
	add.s32 	%r1, %r1, 1;
	wgmma.fence.sync.aligned;
	// begin inline asm
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r2,%r3}, {%r4}, %rd1, %p1, 1, 1, 1;
	// end inline asm
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r2,%r3}, {%r5}, %rd2, %p1, 1, 1, 1;
	wgmma.commit_group.sync.aligned;
	wgmma.wait_group.sync.aligned 0;
	setp.ne.b32 	%p2, %r1, 8;
	@%p2 bra 	$L__BB0_1;
// %bb.2:
	wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%r6}, {%r7}, %rd3, %p1, 1, 1, 1;
	ret;
}
"""


def test_ptx_blocks_and_bound(cc):
    blocks = cc.basic_blocks(PTX, "ptx")
    # $L__tmp4 is no branch target: the loop is one block; directives are not counted
    assert [(b.label, len(b.instructions)) for b in blocks] == [
        (None, 1), ("$L__BB0_1", 8), (None, 2),
    ]  # fmt: skip
    hot = cc.hot_block(PTX, "ptx")
    assert (hot["wgmma"], hot["hot_wgmma"], hot["tc_cycles"], hot["issued"]) == (3, 2, 64, 8)
    assert hot["bound"] == 1.0
    assert cc.hot_block("\tmov.b32 \t%r1, 0;\n\tret;\n", "ptx")["bound"] is None


def _row(**changes) -> dict:
    row = {"kernel": "_k", "dtype": "bfloat16", "d": 64, "wgmma": 16, "spill_stores": 0,
           "spill_loads": 0, "bound": 0.8, "shared_bytes": 64 * 1024}  # fmt: skip
    row.update(changes)
    return row


CHECKED = [("bfloat16", 64), ("float16", 64), ("float32", 64)]


@pytest.mark.parametrize(
    ("changes", "failed", "says"),
    [
        ({}, False, "meets the bar"),
        ({"spill_stores": 40, "spill_loads": 40}, True, "spills 40/40 B"),
        ({"bound": 0.49}, True, "bound 0.490 < 0.5"),
        ({"bound": 0.5}, False, "meets the bar"),
        ({"dtype": "float32", "bound": 0.1, "spill_stores": 8}, False, "float32: not gated"),
        ({"wgmma": 0, "bound": None, "spill_stores": 8}, False, "no wgmma"),
        ({"shared_bytes": 228 * 1024}, True, "shared memory"),
        ({"dtype": "float32", "shared_bytes": 228 * 1024}, True, "shared memory"),
        ({"error": "CompilationError: at 8:28:\n  boom"}, True, "FAILED: CompilationError: at"),
    ],
    ids=["meets", "spills", "low-bound", "at-bar", "float32", "no-wgmma", "smem", "smem-fp32",
         "error"],
)  # fmt: skip
def test_verdicts(cc, changes, failed, says):
    row = _row(**changes)
    failures = cc.judge([row], {}, CHECKED)
    assert row["failed"] is failed
    assert says in row["verdict"]
    assert len(failures) == int(failed)


def test_known_below_bar_list_stays_true(cc):
    known = {("_k", "bfloat16", 64): "rebuilt next", ("_gone", "float16", 64): "renamed"}
    low, fine = _row(bound=0.2), _row(bound=0.9, flags="HAS_MASK")
    other = _row(kernel="_j", bound=0.2)  # below the bar and not listed
    failures = cc.judge([low, fine, other], known, CHECKED)
    assert low["verdict"].startswith("known below the bar (bound 0.200") and not low["failed"]
    assert fine["verdict"] == "meets the bar" and not fine["failed"]  # its group still misses
    assert other["failed"]
    assert len(failures) == 2  # _j and the stale entry
    assert "_j" in failures[0] and "_gone" in failures[1] and "remove it" in failures[1]

    # all of a listed group's variants meet the bar: each fails until the entry goes
    now = [_row(bound=0.7), _row(bound=0.9, flags="HAS_MASK")]
    failures = cc.judge(now, {("_k", "bfloat16", 64): "rebuilt"}, CHECKED)
    assert all(r["failed"] and "remove it from KNOWN_BELOW_BAR" in r["verdict"] for r in now)
    assert len(failures) == 2
    # an entry of a (dtype, d) the run did not compile is not judged
    assert cc.judge([], {("_k", "bfloat16", 128): "later"}, CHECKED) == []


def test_table_has_the_columns(cc):
    rows = [_row(flags="FINISH STORE_DEN", registers=255, spill_stores=40, spill_loads=40)]
    cc.judge(rows, {}, CHECKED)
    text = cc.table(rows)
    for word in ("kernel", "flags", "regs", "spill st/ld", "smem KiB", "wgmma", "bound",
                 "FINISH STORE_DEN", "255", "40/40", "64.0", "0.80", "FAILED: spills"):  # fmt: skip
        assert word in text


# Two tiny kernels compiled for sm_90a (no GPU needed): the same loop of one bf16 dot, bare
# and behind 24 multiply-adds on every element of its first operand.


def _dot_loop(a_ptr, b_ptr, c_ptr, K, WORK: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :])
        b = tl.load(b_ptr + (k0 + rk)[:, None] * BLOCK_N + rn[None, :])
        if WORK:
            x = a.to(tl.float32)
            for _ in tl.static_range(24):
                x = x * x + 0.5
            a = x.to(tl.bfloat16)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * BLOCK_N + rn[None, :], acc)


def compile_tiny(cc) -> dict:
    """{"bare" / "work" / "again": the compile_check row} of ``_dot_loop`` at 64 × N × 64
    tiles, 4 warps, 3 stages: N = 128 bare (twice), N = 64 with the work."""
    import torch
    from triton.backends.compiler import GPUTarget

    kernel = JITFunction(_dot_loop)
    bind = cc._binder(GPUTarget("cuda", 90, 32))
    tool = cc.tools()
    rows = {}
    # "again": the bare kernel from Triton's cache, where no ptxas runs in the compile and
    # the check runs ptxas itself
    for name, work, n in (("bare", False, 128), ("work", True, 64), ("again", False, 128)):
        a = torch.zeros(64, 256, dtype=torch.bfloat16)
        b = torch.zeros(256, n, dtype=torch.bfloat16)
        c = torch.zeros(64, n)
        sig, consts, attrs, options, approx = bind(
            kernel, (a, b, c, 256), dict(WORK=work, BLOCK_M=64, BLOCK_N=n, BLOCK_K=64,
                                         num_warps=4, num_stages=3),
        )  # fmt: skip
        variant = cc.Variant(kernel, "test", "bfloat16", 64, "bfloat16", sig, consts, attrs,
                             options, approx)  # fmt: skip
        rows[name] = cc.compile_one(variant, tool)
    return rows


CHILD = """
import importlib.util, json, sys
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
cc = load("compile_check", sys.argv[1])
tiny = load("tiny_kernels", sys.argv[2])
print("ROWS " + json.dumps(tiny.compile_tiny(cc)))
"""


def _compile_tiny(tmp_path: Path) -> dict:
    """The two kernels compiled in a process of their own (under TRITON_INTERPRET=1, this
    suite on a machine without CUDA, Triton's language builtins do not compile), in an
    empty Triton cache."""
    if tl is None:
        pytest.skip("compiling for sm_90a needs triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    done = subprocess.run([sys.executable, "-c", CHILD, str(SCRIPT), __file__], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    line = [x for x in done.stdout.splitlines() if x.startswith("ROWS ")]
    assert done.returncode == 0 and line, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(line[-1][5:])


def test_the_bound_of_two_tiny_kernels_compiled_for_sm_90a(tmp_path):
    # (one test, so that the kernels compile once: seconds of ptxas)
    tiny = _compile_tiny(tmp_path)

    # a bare dot loop is tensor-core bound
    row = tiny["bare"]
    assert "error" not in row, row.get("error")
    assert row["ptx_target"] == "sm_90a"
    assert (row["spill_stores"], row["spill_loads"]) == (0, 0)
    assert row["registers"] < 255
    assert row["hot_wgmma"] == 4  # K = 64 a step: four m64n128k16
    assert row["tc_cycles"] == 4 * 64
    assert row["bound"] >= 0.8, row

    # elementwise work beside the dot makes it issue bound
    row = tiny["work"]
    assert "error" not in row, row.get("error")
    assert row["hot_wgmma"] == 4  # four m64n64k16 a step
    assert row["tc_cycles"] == 4 * 32
    # 24 FMA on each of a thread's 32 elements alone are 768 issue slots against 128 cycles
    assert row["issued"] > 768
    assert row["bound"] < 0.2, row

    # a kernel from Triton's cache is measured alike
    assert (tiny["bare"]["ptxas_run"], tiny["again"]["ptxas_run"]) == ("compile", "again")
    keys = ("registers", "spill_stores", "spill_loads", "shared_bytes", "wgmma", "bound")
    assert {k: tiny["again"][k] for k in keys} == {k: tiny["bare"][k] for k in keys}
