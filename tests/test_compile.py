"""torch.compile(fullgraph=True): the op in every mode, the modules and the models trace as
one graph, forward and backward, and compute what eager mode computes.

Most cases use the ``aot_eager`` backend (Dynamo and AOTAutograd trace the whole graph,
forward and backward, without generating code: a graph break fails ``fullgraph=True``
the same way, in a fraction of the time); one case compiles with Inductor, the default
backend, end to end.
"""

from __future__ import annotations

import pytest
import torch

import taylorshift.nn.cache
from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.models import create_model
from taylorshift.nn import Attention, TaylorShiftAttention
from taylorshift.ops.taylor_shift.dispatch import choose_mode, switch_length
from tests.helpers import assert_rel_close, forget_what_dynamo_saw, key_padding

B, H, N, D = 2, 3, 37, 8


@pytest.fixture(autouse=True)
def fresh_dynamo():
    forget_what_dynamo_saw()  # (tables built by earlier tests, see tests/helpers.py)
    yield
    torch._dynamo.reset()


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=g, requires_grad=True) for _ in range(3)]


def _grads(fn, tensors):
    out = fn(*tensors)
    return (out, *torch.autograd.grad(out.square().sum(), tensors))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["direct", "efficient", "auto"])
def test_op_compiles_whole_and_matches_eager(mode, causal):
    # (key padding throughout; the models' cases below run without a mask)
    mask = key_padding(B, N)
    tau = torch.full((1, H, 1, 1), 1.7, requires_grad=True)

    def op(q, k, v, t):
        return taylor_shift_attention(
            q, k, v, mask, causal, temperature=t, mode=mode
        )  # fmt: skip

    tensors = [*_inputs(), tau]
    compiled = torch.compile(op, backend="aot_eager", fullgraph=True)
    for name, got, want in zip(
        ["out", "dq", "dk", "dv", "dtau"],
        _grads(compiled, tensors),
        _grads(op, tensors),
        strict=True,
    ):
        assert_rel_close(got, want, 1e-5, name, atol=1e-7)


@pytest.mark.parametrize(
    ("heads", "shape"),
    [(3, (1, 1, 1, 1)), (3, ()), (1, (1, 1, 1, 1)), (3, (B, 1, 1, 1))],
    ids=["one-for-all-heads", "0-d", "one-head", "per-batch-entry"],
)
@pytest.mark.parametrize(
    "form", ["direct", "efficient", "causal", "causal-state"], ids=lambda x: x
)  # fmt: skip
def test_compiled_kernels_take_a_broadcast_temperature(form, heads, shape):
    # A tensor temperature that broadcasts to (B, H, 1, 1) from fewer entries: traced, the
    # CPU kernels' custom ops got its per-head factors as a stride-0 view (B·H,), whose
    # address C read as B·H floats (wrong outputs past the first head). Outputs and every
    # gradient against the float64 reference; a state call also returns its state.
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(B, heads, N, D, generator=g) for _ in range(3))
    tau = torch.rand(shape, generator=g) + 0.5
    mode, causal = ("direct", False) if form == "direct" else ("efficient", form != "efficient")
    state = form == "causal-state"

    def op(q, k, v, t):
        out = taylor_shift_attention(
            q, k, v, None, causal, temperature=t, mode=mode, output_final_state=state
        )
        return out[0] if state else out

    compiled = torch.compile(op, backend="aot_eager", fullgraph=True)
    got = _grads(compiled, [x.clone().requires_grad_() for x in (q, k, v, tau)])
    exact = [x.double().requires_grad_() for x in (q, k, v, tau)]

    def reference(q, k, v, t):
        return naive_taylor_shift_attention(q, k, v, None, causal, temperature=t)

    want = _grads(reference, exact)
    for name, a, e in zip(["out", "dq", "dk", "dv", "dtau"], got, want, strict=True):
        assert_rel_close(a, e, 2e-5, name, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_op_compiles_whole_with_dynamic_shapes(causal):
    # dynamic=True: batch and length are symbols from the first trace (a float check of
    # the arguments, math.isfinite, and auto's choice of form had broken the graph). Not
    # causal, auto runs the direct kernel at N = 21 and the efficient one at 37 (its
    # switch is at 26 for d = 8), causal the direct kernel at both.
    mode = "auto"
    tau = torch.full((1, H, 1, 1), 1.7, requires_grad=True)

    def op(q, k, v, mask, t):
        # is_causal from a comparison of sizes, a symbol too (as transformers passes it)
        is_causal = causal and q.shape[2] > 1
        return taylor_shift_attention(q, k, v, mask, is_causal, temperature=t, mode=mode)

    compiled = torch.compile(op, backend="aot_eager", fullgraph=True, dynamic=True)
    for batch, n in [(2, 37), (3, 21)]:
        g = torch.Generator().manual_seed(n)
        tensors = [torch.randn(batch, H, n, D, generator=g, requires_grad=True) for _ in "qkv"]
        mask = key_padding(batch, n)

        def call(fn, *tensors, _mask=mask):
            out = fn(*tensors[:3], _mask, tensors[3])
            return (out, *torch.autograd.grad(out.square().sum(), tensors))

        got, want = call(compiled, *tensors, tau), call(op, *tensors, tau)
        for name, a, e in zip(["out", "dq", "dk", "dv", "dtau"], got, want, strict=True):
            assert_rel_close(a, e, 1e-5, f"{name} B={batch} N={n}", atol=1e-7)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_with_dynamic_shapes_compiles_once_each_side_of_its_switch(causal):
    # A graph traced at symbolic lengths serves every length on its side of the switch of
    # dispatch.switch_length (one compilation for two lengths), and a length past it
    # compiles again and runs the other form, as eager auto does. (float32 on the CPU: the
    # kernels, whose custom op names its form in the graph.)
    kw = dict(causal=causal, order=2, mask_varies=False, device=torch.device("cpu"))
    kw.update(dtype=torch.float32, backward=False, batch_heads=2)
    switch = switch_length(8, 8, **kw)
    assert choose_mode(switch - 1, switch - 1, 8, 8, **kw) == "direct"
    assert choose_mode(switch, switch, 8, 8, **kw) == "efficient"
    graphs = []

    def counting_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def op(q, k, v):
        return taylor_shift_attention(q, k, v, is_causal=causal)

    compiled = torch.compile(op, backend=counting_backend, fullgraph=True, dynamic=True)
    for n in [switch - 9, switch - 1, switch, switch + 40]:
        q, k, v = (torch.randn(1, 2, n, 8) for _ in "qkv")
        want = naive_taylor_shift_attention(q, k, v, is_causal=causal)
        assert_rel_close(compiled(q, k, v), want, 1e-5, f"N={n}", atol=1e-7)
    forms = [
        node.args[0]
        for graph in graphs
        for node in graph.graph.nodes
        if node.target is torch.ops.taylorshift.cpu_forward.default
    ]
    assert forms == ["direct", "causal" if causal else "efficient"]
    assert len(graphs) == 2


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_op_with_plain_scores_compiles(dynamic):
    def op(q, k, v):
        return taylor_shift_attention(
            q, k, v, is_causal=True, normalize=False, scale=0.3, mode="efficient"
        )

    tensors = _inputs(1)
    compiled = torch.compile(op, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    for got, want in zip(_grads(compiled, tensors), _grads(op, tensors), strict=True):
        assert_rel_close(got, want, 1e-5, atol=1e-7)


def test_full_shape_key_padding_mask_takes_the_direct_form_when_traced():
    # Tracing cannot look at the values, so a (B, H, Nq, Nk) mask counts as varying: auto
    # picks direct (same result), and efficient asks for (B, H, 1, Nk) key padding.
    mask = key_padding(B, N).expand(B, H, N, N)
    q, k, v = _inputs(2)
    eager = taylor_shift_attention(q, k, v, mask, mode="auto")
    traced = torch.compile(
        lambda q, k, v: taylor_shift_attention(q, k, v, mask, mode="auto"),
        backend="aot_eager",
        fullgraph=True,
    )
    assert_rel_close(traced(q, k, v), eager, 1e-5, atol=1e-7)
    efficient = torch.compile(
        lambda q, k, v: taylor_shift_attention(q, k, v, mask, mode="efficient"),
        backend="aot_eager",
        fullgraph=True,
    )
    with pytest.raises(Exception, match=r"under torch\.compile every mask of shape"):
        efficient(q, k, v)


def test_modules_compile_whole():
    # (the short convolution compiles in the models below: causal in lm-conv-efficient,
    # centred with padding in listops-efficient-mean-conv)
    torch.manual_seed(0)
    x = torch.randn(2, 19, 12, requires_grad=True)
    pad = torch.ones(2, 19, dtype=torch.bool)
    pad[1, 11:] = False
    # (each flag a module takes is a graph of its own: the cases where the two differ in
    # our code run both, the others the causal one)
    modules = [
        (TaylorShiftAttention(12, 3, mode="efficient"), (False, True)),
        (Attention(12, 3, attn_kernel="softmax"), (True,)),
        # a local head (sliding-window softmax, tiled) beside two Taylor heads
        (TaylorShiftAttention(12, 3, local_heads=1, window=4), (True,)),
        # linear attention: its feature map's backward had failed traced (linear.py)
        (Attention(12, 3, attn_kernel="linear"), (False, True)),
    ]
    for module, flags in modules:
        compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
        for causal in flags:
            got = compiled(x, attn_mask=pad, is_causal=causal)
            want = module(x, attn_mask=pad, is_causal=causal)
            assert_rel_close(got, want, 1e-5, atol=1e-7)
            (g_got,) = torch.autograd.grad(got.sum(), x)
            (g_want,) = torch.autograd.grad(want.sum(), x)
            assert_rel_close(g_got, g_want, 1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "name, settings",
    [
        ("lm-tiny", {}),
        ("lm-tiny", {"short_conv": 4, "kernel_args": {"mode": "efficient"}}),
        # (q/k norms before a kernel that transposes the keys itself: see Attention._heads)
        ("lm-tiny", {"attn_kernel": "softmax-naive", "qk_norm": True}),
        ("listops-small", {"kernel_args": {"mode": "direct"}}),
        (
            "listops-small",
            {"kernel_args": {"mode": "efficient"}, "pooling": "mean", "short_conv": 3},
        ),
    ],
    ids=[
        "lm",
        "lm-conv-efficient",
        "lm-naive-softmax-qk-norm",
        "listops-direct",
        "listops-efficient-mean-conv",
    ],
)
def test_models_compile_whole_forward_and_backward(name, settings):
    torch.manual_seed(0)
    model = create_model(name, **settings).eval()  # no drop path: both runs draw nothing
    tokens = torch.randint(0, 20, (2, 33))
    mask = torch.ones(2, 33, dtype=torch.bool)
    mask[0, 25:] = False
    args = (tokens,) if name.startswith("lm") else (tokens, mask)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got, want = compiled(*args), model(*args)
    assert_rel_close(got, want, 1e-5, atol=1e-7)
    params = [p for p in model.parameters() if p.requires_grad]
    g_got = torch.autograd.grad(got.square().mean(), params)
    g_want = torch.autograd.grad(want.square().mean(), params)
    for a, e in zip(g_got, g_want, strict=True):
        assert_rel_close(a, e, 1e-4, atol=1e-7)


def test_lm_with_positions_given_and_padding_inside_compiles_whole():
    # given positions: the learned table's range check reads values (eager only); padding
    # before real tokens: the model moves each row's real tokens first (a permutation)
    torch.manual_seed(0)
    model = create_model("lm-tiny", pos_embedding="learned", short_conv=3).eval()
    tokens = torch.randint(0, 20, (2, 17))
    mask = torch.ones(2, 17, dtype=torch.bool)
    mask[0, :5] = False  # left padding
    mask[1, 3:6] = False  # padding between real tokens
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got, want = compiled(tokens, mask, positions), model(tokens, mask, positions)
    assert_rel_close(got[mask], want[mask], 1e-5, atol=1e-7)
    params = [p for p in model.parameters() if p.requires_grad]
    g_got = torch.autograd.grad(got[mask].square().mean(), params)
    g_want = torch.autograd.grad(want[mask].square().mean(), params)
    for a, e in zip(g_got, g_want, strict=True):
        assert_rel_close(a, e, 1e-4, atol=1e-7)


def test_model_compiles_whole_for_batches_of_other_shapes():
    # torch.compile's default: a second shape compiles again with the sizes that changed
    # as symbols; this had broken the graph of every model whose attention picks its form
    # (its backward with symbolic sizes: test_op_compiles_whole_with_dynamic_shapes)
    torch.manual_seed(0)
    model = create_model("listops-small").eval()
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # (Dynamo's part)
    with torch.no_grad():
        for batch, n in [(2, 33), (3, 41)]:
            tokens = torch.randint(0, 20, (batch, n))
            mask = torch.ones(batch, n, dtype=torch.bool)
            mask[0, n - 6 :] = False
            got, want = compiled(tokens, mask), model(tokens, mask)
            assert_rel_close(got, want, 1e-5, f"B={batch} N={n}", atol=1e-7)


@pytest.mark.parametrize("mode, causal", [("direct", False)])
def test_module_exports_with_dynamic_batch_and_length(mode, causal):
    # torch.export with symbolic batch and length, a mode given, run at other shapes than
    # the example's (the causal efficient kernel exports inside auto's torch.cond, below)
    torch.manual_seed(0)
    module = TaylorShiftAttention(16, 4, mode=mode).eval()
    x, pad = torch.randn(2, 50, 16), torch.ones(2, 50, dtype=torch.bool)
    sizes = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("length", max=4096)}
    program = torch.export.export(
        module,
        (x,),
        {"attn_mask": pad, "is_causal": causal},
        dynamic_shapes={"x": sizes, "attn_mask": sizes, "is_causal": None},
    )
    for batch, n in [(3, 17), (4, 300)]:
        x, pad = torch.randn(batch, n, 16), torch.ones(batch, n, dtype=torch.bool)
        pad[0, n // 2 :] = False
        got = program.module()(x, attn_mask=pad, is_causal=causal)
        assert_rel_close(got, module(x, attn_mask=pad, is_causal=causal), 1e-6, atol=1e-7)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_exports_with_dynamic_lengths_and_picks_its_form_when_run(causal):
    # torch.export refuses the guard by which a compiled auto graph keeps to one side of
    # its switch; the exported program holds both forms in a torch.cond instead and picks
    # one by the lengths it runs on, as eager auto at the traced B·H (no guard on B either)
    kw = dict(causal=causal, order=2, mask_varies=False, device=torch.device("cpu"))
    kw.update(dtype=torch.float32, backward=False, batch_heads=8)
    switch = switch_length(8, 8, **kw)
    g = torch.Generator().manual_seed(0)

    def inputs(batch, n):
        q, k, v = (torch.randn(batch, 4, n, 8, generator=g) for _ in "qkv")
        pad = torch.rand(batch, 1, 1, n, generator=g) > 0.2
        return q, k, v, pad, torch.rand(1, 4, 1, 1, generator=g) + 0.5

    class Op(torch.nn.Module):
        def forward(self, q, k, v, pad, tau):
            return taylor_shift_attention(q, k, v, pad, causal, temperature=tau)

    sizes = {0: torch.export.Dim("batch", max=64), 2: torch.export.Dim("length", max=8192)}
    padding = {0: sizes[0], 3: sizes[2]}
    program = torch.export.export(
        Op(), inputs(2, 50), dynamic_shapes=(sizes, sizes, sizes, padding, None)
    )
    conds = [n for n in program.graph.nodes if n.target is torch.ops.higher_order.cond]
    assert len(conds) == 1
    branches = [getattr(program.graph_module, node.name) for node in conds[0].args[1:3]]
    forms = [
        node.args[0]
        for branch in branches
        for node in branch.graph.nodes
        if node.target is torch.ops.taylorshift.cpu_forward.default
    ]
    assert forms == ["causal" if causal else "efficient", "direct"]
    for batch, n in [(3, switch - 9), (1, switch - 1), (2, switch), (5, switch + 40)]:
        q, k, v, pad, tau = inputs(batch, n)
        got = program.module()(q, k, v, pad, tau)
        want = naive_taylor_shift_attention(q, k, v, pad, causal, temperature=tau)
        assert_rel_close(got, want, 1e-5, f"B={batch} N={n}", atol=1e-7)
        mode = "efficient" if n >= switch else "direct"  # (the kernels: the same bits)
        form = taylor_shift_attention(q, k, v, pad, causal, temperature=tau, mode=mode)
        assert torch.equal(got, form), f"B={batch} N={n}: not the {mode} form"


def test_language_model_exports_with_dynamic_batch_and_length():
    # what a user exporting the LM for serving writes; with mode="auto" in every layer this
    # failed before the torch.cond (the layers' guards on B and N)
    torch.manual_seed(0)
    model = create_model("lm-tiny").eval()
    sizes = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("length", max=1024)}
    program = torch.export.export(model, (torch.randint(0, 256, (2, 64)),), dynamic_shapes=(sizes,))
    with torch.no_grad():
        for batch, n in [(3, 16), (1, 700)]:
            tokens = torch.randint(0, 256, (batch, n))
            got, want = program.module()(tokens), model(tokens)
            assert_rel_close(got, want, 1e-5, f"B={batch} N={n}", atol=1e-6)


@pytest.mark.slow
def test_inductor_compiles_the_efficient_form_end_to_end():
    q, k, v = _inputs(3)

    def op(q, k, v):
        return taylor_shift_attention(q, k, v, is_causal=True, mode="efficient")

    compiled = torch.compile(op, fullgraph=True)
    for got, want in zip(_grads(compiled, [q, k, v]), _grads(op, [q, k, v]), strict=True):
        assert_rel_close(got, want, 1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "kernel, cache", [("taylorshift", "state"), ("softmax", "kv"), ("linear", "state")]
)
def test_decoding_step_compiles_whole(kernel, cache, monkeypatch):
    # the step a generation loop compiles: model.decode of one token, caches updated in
    # place. The key/value cache grows by a token per step: torch.compile's default traces
    # again at the second step with its length as a symbol (torch.compile's default, not
    # dynamic=True). Its buffers get 1 token of room here (and an eighth), so that the
    # steps cross a move to larger buffers.
    monkeypatch.setattr(taylorshift.nn.cache, "KV_CACHE_ROOM", 1)
    torch.manual_seed(0)
    model = create_model("lm-tiny", attn_kernel=kernel).eval()
    step = torch.compile(model.decode, backend="aot_eager", fullgraph=True)
    prompt = torch.randint(0, 20, (2, 9))
    with torch.inference_mode():
        eager_caches, compiled_caches = model.new_caches(cache), model.new_caches(cache)
        for caches in (eager_caches, compiled_caches):
            model.decode(prompt, caches, torch.arange(9).expand(2, 9))
        # (key/value buffers: room for 11 tokens, then 14: the third step moves them and
        # attends over the moved content; a state has a constant size)
        for i in range(3):
            token, position = torch.randint(0, 20, (2, 1)), torch.full((2, 1), 9 + i)
            want = model.decode(token, eager_caches, position)
            got = step(token, compiled_caches, position)
            assert_rel_close(got, want, 1e-5, atol=1e-6)
