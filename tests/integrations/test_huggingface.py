"""TaylorShift inside Hugging Face transformers: attn_implementation="taylorshift".

Tiny models built from configs (no downloads): BERT (encoder), Llama (decoder with grouped-
query attention), GPT-2 (decoder, per-layer scaling). Two independent checks of what the
models compute: each attention call against our op on the same q/k/v with masks built here
from the 2-D padding mask, and whole models against the same models running a test-side
attention (the naive reference, masks built here, transformers' mask ignored).
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.integrations import huggingface as hf
from tests.helpers import assert_rel_close

# transformers takes seconds to import and every test worker collects this module: it is
# imported by the tests (``_tf()``), and they run on one worker.
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None,
        reason='transformers is not installed: pip install "taylorshift[hf]"',
    ),
    pytest.mark.xdist_group("huggingface"),
]


def _tf():
    """The transformers module, imported at first use."""
    import transformers

    return transformers


NAME = "taylorshift"
REFERENCE = "taylorshift-test-reference"
RTOL = 1e-10


@dataclass
class Reference:
    """What the test-side attention uses: its own mask and score settings."""

    padding: torch.Tensor | None = None  # (B, Nk), 1 = attend
    full_mask: torch.Tensor | None = None  # (B, 1, Nq, Nk) bool, replaces padding
    causal: bool = False
    score: dict = field(default_factory=dict)  # temperature=... / normalize=False


REF = Reference()


def _reference_forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    mask = REF.full_mask
    if mask is None and REF.padding is not None:
        mask = REF.padding.bool()[:, None, None, :]
    score = dict(REF.score)
    if score.get("normalize") is False:
        score["scale"] = scaling
    y = naive_taylor_shift_attention(query, key, value, mask, REF.causal, **score)
    return y.transpose(1, 2), None


@pytest.fixture(autouse=True, scope="module")
def registered():
    hf.register(NAME)
    _tf().AttentionInterface.register(REFERENCE, _reference_forward)
    yield
    hf.unregister(NAME)
    _tf().AttentionInterface._global_mapping.pop(REFERENCE, None)


@pytest.fixture(autouse=True)
def fresh_reference():
    REF.__init__()


TINY_DECODER = {
    "vocab_size": 40,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention: 2 query heads per key/value head
    "max_position_embeddings": 32,
    "pad_token_id": 0,
}


def _llama_config(**kwargs):
    return _tf().LlamaConfig(**TINY_DECODER, **kwargs)


def _gpt2_config(**kwargs):
    return _tf().GPT2Config(
        vocab_size=40,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=32,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        scale_attn_by_inverse_layer_idx=True,  # layer l scales scores by 1/sqrt(d)/(l+1)
        pad_token_id=0,
        **kwargs,
    )


def _bert_config(**kwargs):
    kwargs.setdefault("attention_probs_dropout_prob", 0.0)
    return _tf().BertConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        **kwargs,
    )


def _model(config, attn=NAME, seed=0, causal_lm=True):
    torch.manual_seed(seed)
    auto = _tf().AutoModelForCausalLM if causal_lm else _tf().AutoModel
    return auto.from_config(config, attn_implementation=attn).double().eval()


def _same_weights(model, attn):
    """A copy of ``model`` with another attention implementation."""
    config = copy.deepcopy(model.config)  # from_config keeps the object: do not share it
    other = _model(config, attn=attn, seed=1, causal_lm=hasattr(model, "lm_head"))
    other.load_state_dict(model.state_dict())
    return other


def _ids(b=3, n=9, seed=0):
    return torch.randint(1, 40, (b, n), generator=torch.Generator().manual_seed(seed))


def _padding(n=9, lengths=(9, 6, 2), left=False):
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for row, length in enumerate(lengths):
        if left:
            mask[row, n - length :] = 1
        else:
            mask[row, :length] = 1
    return mask


def _positions(mask):
    """Left-padded rows count their positions from their first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _encoder_out(model, ids, mask):
    return model(ids, attention_mask=mask).last_hidden_state


def _decoder_out(model, ids, mask):
    return model(ids, attention_mask=mask, position_ids=_positions(mask)).logits


ARCHITECTURES = {
    "bert": (_bert_config, False),
    "llama": (_llama_config, True),
    "gpt2": (_gpt2_config, True),
}


# --- whole models against the test-side reference attention ------------------------------


OPTIONS = {
    "defaults": {},
    "direct": {"mode": "direct"},
    "efficient": {"mode": "efficient"},
    "tau3": {"temperature": 3.0},
    "unnormalized": {"normalize": False},
}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_model_equals_model_with_reference_attention(arch, options):
    make_config, causal = ARCHITECTURES[arch]
    config = make_config(taylorshift=options)  # the per-model options
    model = _model(config, causal_lm=causal)
    reference = _same_weights(model, REFERENCE)
    ids, mask = _ids(), _padding(left=causal)
    REF.padding, REF.causal = mask, causal
    REF.score = {k: v for k, v in options.items() if k in ("temperature", "normalize")}
    run = _decoder_out if causal else _encoder_out
    expected = run(reference, ids, mask)
    assert_rel_close(run(model, ids, mask), expected, RTOL, f"{arch} {options}")
    # the padding matters: without it the outputs differ
    REF.padding = None
    assert not torch.allclose(run(reference, ids, mask), expected)


def test_per_model_options_override_the_registered_ones():
    config = _llama_config(taylorshift={"temperature": 4.0})
    model = _model(config)
    default = _same_weights(model, NAME)
    default.config.taylorshift = None
    ids, mask = _ids(), _padding(left=True)
    REF.padding, REF.causal, REF.score = mask, True, {"temperature": 4.0}
    expected = _decoder_out(_same_weights(model, REFERENCE), ids, mask)
    assert_rel_close(_decoder_out(model, ids, mask), expected, RTOL, "tau 4")
    assert not torch.allclose(_decoder_out(default, ids, mask), expected)


# --- each attention call against our op on the same q/k/v ---------------------------------


@pytest.fixture
def recorder():
    """Wrap the registered attention; yield the list of (module, q, k, v, mask, output)."""
    calls = []
    inner = _tf().AttentionInterface._global_mapping[NAME]

    def recording(module, query, key, value, attention_mask, **kwargs):
        out, weights = inner(module, query, key, value, attention_mask, **kwargs)
        calls.append((module, query, key, value, attention_mask, out))
        return out, weights

    _tf().AttentionInterface.register(NAME, recording)
    yield calls
    _tf().AttentionInterface.register(NAME, inner)


def _op(query, key, value, padding, causal):
    groups = query.shape[1] // key.shape[1]
    return taylor_shift_attention(
        query,
        key.repeat_interleave(groups, dim=1),
        value.repeat_interleave(groups, dim=1),
        attn_mask=padding.bool()[:, None, None, :],
        is_causal=causal,
        mode="direct",
    ).transpose(1, 2)


def test_decoder_attention_calls_equal_the_op_and_build_no_square_mask(recorder):
    model = _model(_llama_config())
    ids, mask = _ids(), _padding(left=True)
    _decoder_out(model, ids, mask)
    assert len(recorder) == 2
    for module, query, key, value, attention_mask, out in recorder:
        assert key.shape[1] == 2 and query.shape[1] == 4  # GQA reaches us unrepeated
        assert attention_mask.shape == (3, 1, 1, 9)  # key padding only: no (Nq, Nk) mask
        assert_rel_close(out, _op(query, key, value, mask, True), RTOL, module.__class__.__name__)


def test_encoder_attention_calls_equal_the_op_and_build_no_square_mask(recorder):
    model = _model(_bert_config(), causal_lm=False)
    ids, mask = _ids(), _padding()
    _encoder_out(model, ids, mask)
    assert len(recorder) == 2
    for _, query, key, value, attention_mask, out in recorder:
        assert attention_mask.shape == (3, 1, 9, 9)
        assert attention_mask.stride(-2) == 0  # an expanded view of one row per sequence
        assert_rel_close(out, _op(query, key, value, mask, False), RTOL, "bert attention")


def test_unpadded_decoder_gets_no_mask_and_is_causal(recorder):
    model = _model(_llama_config())
    ids = _ids()
    model(ids, attention_mask=torch.ones_like(ids))
    for _, query, key, value, attention_mask, out in recorder:
        assert attention_mask is None
        assert_rel_close(out, _op(query, key, value, torch.ones(3, 9), True), RTOL, "causal")


# --- padded batches, cached decoding -------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_padded_batch_equals_each_sequence_alone(arch):
    make_config, causal = ARCHITECTURES[arch]
    model = _model(make_config(), causal_lm=causal)
    ids, mask = _ids(), _padding(left=causal)
    run = _decoder_out if causal else _encoder_out
    batch = run(model, ids, mask)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = run(model, ids[row : row + 1, real], mask[row : row + 1, real])
        assert_rel_close(batch[row, real], alone[0], RTOL, f"{arch} row {row}")


def test_cached_decoding_equals_the_full_forward():
    model = _model(_llama_config())
    ids, mask = _ids(n=12), _padding(n=12, lengths=(12, 8, 5), left=True)
    positions = _positions(mask)
    full = model(ids, attention_mask=mask, position_ids=positions).logits
    # prefill 8 tokens, one token at a time, then a 2-token chunk on the cache (the latter
    # takes transformers' full (Nq, Nk) mask: causality is not upper-left aligned there)
    steps = [(0, 8), (8, 9), (9, 10), (10, 12)]
    # transformers 5.24 renamed past_key_values to cache (the old name warns until 5.40)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = None
    for start, stop in steps:
        out = model(
            ids[:, start:stop],
            attention_mask=mask[:, :stop],
            position_ids=positions[:, start:stop],
            use_cache=True,
            **{name: cache},
        )
        cache = getattr(out, name)
        real = mask[:, start:stop].bool()
        assert_rel_close(out.logits[real], full[:, start:stop][real], RTOL, f"{start}:{stop}")


def test_generate_with_cache_equals_generate_without():
    model = _model(_llama_config())
    ids, mask = _ids(), _padding(left=True)
    settings = {"attention_mask": mask, "max_new_tokens": 4, "do_sample": False}
    cached = model.generate(ids, use_cache=True, **settings)
    uncached = model.generate(ids, use_cache=False, **settings)
    assert cached.shape == (3, 13)
    assert torch.equal(cached, uncached)


# --- masks given by the user ---------------------------------------------------------------


def test_additive_4d_float_mask_equals_the_2d_mask():
    model = _model(_bert_config(), causal_lm=False)
    ids, mask = _ids(), _padding()
    additive = (1.0 - mask[:, None, None, :].double()) * torch.finfo(torch.float64).min
    additive = additive.expand(3, 1, 9, 9)
    assert_rel_close(
        _encoder_out(model, ids, additive), _encoder_out(model, ids, mask), RTOL, "additive"
    )
    with_inf = torch.zeros(3, 1, 9, 9, dtype=torch.float64).masked_fill(
        ~mask.bool()[:, None, None], -torch.inf
    )
    assert_rel_close(
        _encoder_out(model, ids, with_inf), _encoder_out(model, ids, mask), RTOL, "-inf"
    )


def test_general_4d_bool_mask_equals_the_reference_and_needs_direct():
    model = _model(_bert_config(), causal_lm=False)
    ids = _ids()
    band = torch.ones(9, 9, dtype=torch.bool).triu(-2).tril(2)  # a local window
    full = (band & _padding().bool()[:, None, :])[:, None]  # (B, 1, Nq, Nk), varies over Nq
    REF.full_mask = full
    expected = _encoder_out(_same_weights(model, REFERENCE), ids, full)
    assert_rel_close(_encoder_out(model, ids, full), expected, RTOL, "band mask")
    model.config.taylorshift = {"mode": "efficient"}
    with pytest.raises(ValueError, match=r"attn_mask varies over queries.*mode='direct'"):
        _encoder_out(model, ids, full)


def test_sliding_window_decoder_takes_transformers_mask_and_the_direct_form(recorder):
    config = _tf().MistralConfig(**TINY_DECODER, sliding_window=3)
    model = _model(config)
    ids, mask = _ids(), _padding(left=True)
    i = torch.arange(9)
    window = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < 3)  # (Nq, Nk)
    REF.full_mask = (window & mask.bool()[:, None, :])[:, None]
    expected = _decoder_out(_same_weights(model, REFERENCE), ids, mask)
    assert_rel_close(_decoder_out(model, ids, mask), expected, RTOL, "sliding window")
    assert all(call[4].shape == (3, 1, 9, 9) for call in recorder)


def test_bias_in_an_additive_mask_is_refused():
    model = _model(_bert_config(), causal_lm=False)
    bias = torch.zeros(3, 1, 9, 9, dtype=torch.float64)
    bias[0, 0, 0, 0] = -0.5
    with pytest.raises(ValueError, match=r"attention_mask: an additive float mask.*-0\.5"):
        _encoder_out(model, _ids(), bias)
    with pytest.raises(TypeError, match=r"attention_mask: a 4-D mask must be bool.*torch\.int64"):
        _encoder_out(model, _ids(), torch.ones(3, 1, 9, 9, dtype=torch.long))


# --- scaling, temperature, gradients, dropout ------------------------------------------------


def test_scaling_is_used_only_without_normalization():
    ids, mask = _ids(), _padding(left=True)
    for normalize in (True, False):
        model = _model(_llama_config(taylorshift={"normalize": normalize}))
        before = _decoder_out(model, ids, mask)
        for layer in model.model.layers:
            layer.self_attn.scaling *= 3.0
        after = _decoder_out(model, ids, mask)
        assert torch.equal(before, after) == normalize


def test_gradients_equal_the_reference_models():
    model = _model(_llama_config()).train()
    reference = _same_weights(model, REFERENCE).train()
    ids, mask = _ids(), _padding(left=True)
    REF.padding, REF.causal = mask, True
    for m in (model, reference):
        m.zero_grad()
        out = _decoder_out(m, ids, mask)
        out[mask.bool()].square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.isfinite(p.grad).all(), name
        assert_rel_close(p.grad, q.grad, 1e-9, name)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_decoder_compiles_whole_for_batches_of_other_shapes():
    # torch.compile(fullgraph=True), float32 (the CPU kernels): the mask builder must not
    # read the mask's values (a graph break; a mask with no padding is then kept, not
    # dropped), and at the second shape transformers' is_causal (`causal and Nq > 1`) is a
    # symbol, which auto's choice of form must fix before its constant look-up
    config = _llama_config()
    config.num_hidden_layers = 1  # (Dynamo alone, one layer: the trace takes seconds)
    model = _model(config).float()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    for n, lengths in [(9, (9, 6, 2)), (12, (12, 12, 12))]:
        ids, mask = _ids(n=n), _padding(n=n, lengths=lengths, left=True)
        want = _decoder_out(model, ids, mask)
        assert_rel_close(_decoder_out(compiled, ids, mask), want, 1e-5, f"N={n}", atol=1e-6)


def test_a_learnable_temperature_on_the_module_is_used_and_trained():
    model = _model(_bert_config(), causal_lm=False).train()
    ids, mask = _ids(), _padding()
    before = _encoder_out(model, ids, mask)
    reference = _same_weights(model, REFERENCE)
    taus = []
    for layer in model.encoder.layer:
        tau = nn.Parameter(torch.full((1, 4, 1, 1), 2.0, dtype=torch.float64))
        layer.attention.self.taylorshift_temperature = tau
        taus.append(tau)
    REF.padding, REF.score = mask, {"temperature": 2.0}
    expected = _encoder_out(reference, ids, mask)
    out = _encoder_out(model, ids, mask)
    assert_rel_close(out, expected, RTOL, "tau 2")
    assert not torch.allclose(out, before)
    out.square().mean().backward()
    assert all(tau.grad is not None and tau.grad.abs().sum() > 0 for tau in taus)


def test_attention_dropout_is_refused_in_training_unless_ignored():
    config = _bert_config(attention_probs_dropout_prob=0.1)
    model = _model(config, causal_lm=False).train()
    ids, mask = _ids(), _padding()
    with pytest.raises(ValueError, match=r"dropout: .*expected 0\.0, got 0\.1"):
        _encoder_out(model, ids, mask)
    evaluated = _encoder_out(model.eval(), ids, mask)
    model.config.taylorshift = {"ignore_dropout": True}
    assert torch.equal(_encoder_out(model.train(), ids, mask), evaluated)


# --- options and errors --------------------------------------------------------------------


BAD_OPTIONS = {
    "mode": ({"mode": "fast"}, ValueError, r"register\(\): mode must be one of .*got 'fast'"),
    "order": ({"order": 3}, ValueError, r"register\(\): order must be an even int.*got 3"),
    "tau-type": ({"temperature": "hot"}, TypeError, r"temperature must be a float; got str"),
    "tau-inf": ({"temperature": float("inf")}, ValueError, r"temperature must be finite; got inf"),
    "tau-unnormalized": (
        {"temperature": 2.0, "normalize": False},
        ValueError,
        r"temperature applies only with normalize=True.*temperature=2.0",
    ),
    "normalize": ({"normalize": 1}, TypeError, r"normalize must be a bool; got 1"),
    "dropout": (
        {"ignore_dropout": "yes"},
        TypeError,
        r"register\(\): ignore_dropout must be a bool; got 'yes'",
    ),
}


@pytest.mark.parametrize("kwargs, error, match", BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_register_options_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        hf.register("taylorshift-bad", **kwargs)
    assert "taylorshift-bad" not in _tf().AttentionInterface._global_mapping


def test_names_of_transformers_are_refused():
    with pytest.raises(ValueError, match=r"name must not be one of transformers' own.*'sdpa'"):
        hf.register("sdpa")
    with pytest.raises(ValueError, match=r"name must be a non-empty str; got ''"):
        hf.register("")
    with pytest.raises(ValueError, match=r"name must be one registered by register\(\).*'eager'"):
        hf.unregister("eager")


BAD_CONFIG = {
    "unknown": ({"modes": "direct"}, ValueError, r"config.taylorshift has unknown option.*modes"),
    "mode": ({"mode": "fast"}, ValueError, r"config.taylorshift: mode must be one of .*'fast'"),
    "type": ("direct", TypeError, r"config.taylorshift must be a dict .*got str"),
}


@pytest.mark.parametrize("options, error, match", BAD_CONFIG.values(), ids=BAD_CONFIG.keys())
def test_bad_config_options_raise(options, error, match):
    model = _model(_llama_config())
    model.config.taylorshift = options
    with pytest.raises(error, match=match):
        model(_ids())


def test_a_second_name_holds_its_own_options():
    name = hf.register("taylorshift-direct-tau2", mode="direct", temperature=2.0)
    try:
        model = _model(_llama_config(), attn=name)
        ids, mask = _ids(), _padding(left=True)
        REF.padding, REF.causal, REF.score = mask, True, {"temperature": 2.0}
        expected = _decoder_out(_same_weights(model, REFERENCE), ids, mask)
        assert_rel_close(_decoder_out(model, ids, mask), expected, RTOL, name)
    finally:
        hf.unregister(name)
    assert name not in _tf().AttentionInterface._global_mapping


class _Module(nn.Module):
    is_causal = False


def _qkv(heads=4, kv_heads=4):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, heads, 5, 8, generator=g),
        torch.randn(2, kv_heads, 5, 8, generator=g),
        torch.randn(2, kv_heads, 5, 8, generator=g),
    )


def test_unsupported_attention_arguments_raise():
    forward = hf.make_attention_function()
    q, k, v = _qkv()
    out, weights = forward(_Module(), q, k, v, None)
    assert out.shape == (2, 5, 4, 8) and weights is None
    with pytest.raises(ValueError, match=r"softcap: .*cannot apply logit soft-capping.*got 30"):
        forward(_Module(), q, k, v, None, softcap=30.0)
    with pytest.raises(ValueError, match=r"position_bias: .*got a tensor of shape \(1, 4, 5, 5\)"):
        forward(_Module(), q, k, v, None, position_bias=torch.zeros(1, 4, 5, 5))
    with pytest.raises(ValueError, match=r"key and value heads must divide the query heads \(H"):
        forward(_Module(), *_qkv(heads=4, kv_heads=3), None)
    with pytest.raises(ValueError, match=r"attention_mask: expected a 2-D .*got shape \(2, 5, 5\)"):
        forward(_Module(), q, k, v, torch.ones(2, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attention_mask: expected a last dim of Nk = 5"):
        forward(_Module(), q, k, v, torch.ones(2, 1, 1, 6, dtype=torch.bool))


# --- check_model: does the model's attention reach TaylorShift? ----------------------------


def test_check_model_counts_one_call_per_attention_layer_and_forward():
    inner = _tf().AttentionInterface._global_mapping[NAME]
    decoder = _model(_llama_config())
    assert hf.check_model(decoder, _ids()) == decoder.config.num_hidden_layers
    encoder = _model(_bert_config(), causal_lm=False)
    assert hf.check_model(encoder, _ids(), attention_mask=_padding()) == 2
    assert _tf().AttentionInterface._global_mapping[NAME] is inner  # restored


class _OwnAttention(nn.Module):
    """A model that accepts the name in its config but computes softmax attention itself
    (as BLOOM does in transformers 5)."""

    def __init__(self, fail=False):
        super().__init__()
        self.config = types.SimpleNamespace(_attn_implementation=NAME)
        self.fail = fail

    def forward(self, x):
        if self.fail:
            raise RuntimeError("the model failed")
        return torch.nn.functional.scaled_dot_product_attention(x, x, x)


def test_check_model_refuses_a_model_whose_attention_never_reaches_taylorshift():
    inner = _tf().AttentionInterface._global_mapping[NAME]
    x = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"model: _OwnAttention computes its attention without"):
        hf.check_model(_OwnAttention(), x)
    with pytest.raises(RuntimeError, match="the model failed"):
        hf.check_model(_OwnAttention(fail=True), x)
    assert _tf().AttentionInterface._global_mapping[NAME] is inner  # restored either way


def test_check_model_refuses_a_model_set_to_another_attention():
    model = _model(_llama_config(), attn="sdpa")
    with pytest.raises(ValueError, match=r"attn_implementation must be one registered .*'sdpa'"):
        hf.check_model(model, _ids())


def _clip():
    text = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                num_attention_heads=4, max_position_embeddings=16)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=4, image_size=16, patch_size=8)  # fmt: skip
    config = _tf().CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    torch.manual_seed(0)
    model = _tf().CLIPModel._from_config(config, attn_implementation=NAME).eval()
    inputs = {"input_ids": _ids(1, 6), "pixel_values": torch.randn(1, 3, 16, 16)}
    return model, inputs


def test_check_model_finds_options_no_attention_reads():
    # A composite model's attention modules hold sub-configs: a top-level dict is ignored
    # (its temperature changed nothing, a bad mode raised nothing), which check_model says.
    model, inputs = _clip()
    with torch.no_grad():
        before = model(**inputs).logits_per_image
    model.config.taylorshift = {"temperature": 5.0}
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits_per_image, before)  # (what is checked)
    with pytest.raises(ValueError, match=r"config.taylorshift is set but not read: .* from "
                       r"config.text_config, config.vision_config; set them there"):  # fmt: skip
        hf.check_model(model, **inputs)
    model.config.text_config.taylorshift = {"temperature": 5.0}
    model.config.vision_config.taylorshift = {"temperature": 5.0}
    assert hf.check_model(model, **inputs) == 2  # read where the attention reads
    with torch.no_grad():
        assert not torch.equal(model(**inputs).logits_per_image, before)
    decoder = _model(_llama_config())  # one config: the top-level dict is the one read
    decoder.config.taylorshift = {"temperature": 2.0}
    assert hf.check_model(decoder, _ids()) == decoder.config.num_hidden_layers


class _AttentionWithoutConfig(nn.Module):
    """A model whose attention module has no config: it reads register()'s options."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(_attn_implementation=NAME, taylorshift={"order": 2})
        self.attention = nn.Module()

    def forward(self, x):
        attend = _tf().AttentionInterface._global_mapping[NAME]
        return attend(self.attention, x, x, x, None)[0]


def test_check_model_says_when_attention_modules_have_no_config():
    match = r"from register\(\)'s options \(modules without a config\); set them there"
    with pytest.raises(ValueError, match=match):
        hf.check_model(_AttentionWithoutConfig(), torch.randn(1, 2, 5, 4))


def test_output_attentions_warns_that_no_weights_come_back():
    model = _model(_llama_config())
    with pytest.warns(UserWarning, match="output_attentions=True: the taylorshift attention "
                      "returns no attention weights") as warned:  # fmt: skip
        out = model(_ids(), output_attentions=True)
    assert warned[0].filename == __file__  # the caller's line, not transformers' or ours
    assert all(a is None for a in out.attentions)  # (transformers gives () or Nones)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(_ids())  # not asked: no warning


# --- without transformers ------------------------------------------------------------------


def test_missing_transformers_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.raises(ImportError, match=r'pip install "taylorshift\[hf\]"'):
        hf.register()
    with pytest.raises(ImportError, match=r'pip install "taylorshift\[hf\]"'):
        hf.import_transformers()


def test_too_old_transformers_says_which_api_is_missing(monkeypatch):
    old = types.ModuleType("transformers")
    old.__version__ = "4.40.0"
    monkeypatch.setitem(sys.modules, "transformers", old)
    with pytest.raises(ImportError, match=r"AttentionMaskInterface.*got transformers 4\.40\.0"):
        hf.register()


def test_importing_the_integration_does_not_import_transformers():
    code = (
        "import sys, taylorshift.integrations.huggingface; "
        "assert 'transformers' not in sys.modules, 'imported transformers'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
