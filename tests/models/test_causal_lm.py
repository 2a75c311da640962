"""CausalLM: causality, padding, decoding caches against the parallel forward, generate().

Decoding is checked against the plain path: for every kernel and cache, the cached logits
of a ragged batch (prefill + one token at a time) equal ``forward`` over each sequence
alone, and greedy ``generate`` equals a loop that reruns ``forward`` on the whole text.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift.models import CausalLM, CausalLMConfig, create_model, load_model, save_model
from taylorshift.nn import KVCache, StateCache
from tests.helpers import assert_rel_close
from tests.models.cases import lengths_mask

F64 = torch.float64
V = 23
# (attn_kernel, kernel_args, caches to test)
DECODERS = [
    ("taylorshift", {"mode": "direct"}, ("state", "kv")),
    ("taylorshift", {"mode": "efficient"}, ("state", "kv")),
    ("taylorshift", {"normalize": False}, ("state",)),
    ("taylorshift", {"local_heads": 1, "window": 3}, ("state", "kv")),
    ("softmax", {}, ("kv",)),
    ("softmax-naive", {}, ("kv",)),
    ("linear", {}, ("state", "kv")),
    ("holt", {}, ("kv",)),
]
DECODER_IDS = [k + "".join(f"-{v}" for v in a.values()) for k, a, _ in DECODERS]
# the short convolution (3 taps) around a stateful and a key/value kernel
CONV_DECODERS = [("taylorshift", {"mode": "efficient"}, ("state", "kv")), ("softmax", {}, ("kv",))]


def lm(kernel="taylorshift", kernel_args=None, seed=0, **settings) -> CausalLM:
    base = dict(vocab_size=V, dim=24, depth=2, num_heads=3, mlp_ratio=2)
    base.update(settings)
    torch.manual_seed(seed)
    config = CausalLMConfig(attn_kernel=kernel, kernel_args=kernel_args or {}, **base)
    model = CausalLM(config, dtype=F64).eval()
    for name, p in model.named_parameters():  # spread the temperatures away from 1
        if name.endswith("temperature"):
            p.data.uniform_(0.5, 2.0)
    return model


def tokens(b, n, seed=1):
    return torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("short_conv", [0, 3], ids=["no-conv", "conv3"])
def test_forward_is_causal(short_conv):
    model = lm(short_conv=short_conv)
    x = tokens(2, 12)
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 5) % V
    assert_rel_close(model(y)[:, :7], model(x)[:, :7], 1e-12)
    assert (model(y)[:, 7:] - model(x)[:, 7:]).abs().max() > 1e-3


@pytest.mark.parametrize("short_conv", [0, 3], ids=["no-conv", "conv3"])
@pytest.mark.parametrize("local", [0, 1], ids=["taylor", "local-head"])
def test_padded_batch_equals_sequences_alone(short_conv, local):
    args = {"local_heads": local, "window": 3} if local else {}
    model = lm(kernel_args=args, short_conv=short_conv)
    x, lengths = tokens(3, 10), [10, 4, 7]
    batched = model(x, lengths_mask(lengths, 10))
    for i, n in enumerate(lengths):
        alone = model(x[i : i + 1, :n])
        assert_rel_close(batched[i : i + 1, :n], alone, 1e-10, f"item {i}")


@pytest.mark.parametrize(
    ("args", "short_conv"),
    [({}, 0), ({}, 3), ({"local_heads": 1, "window": 2}, 0)],
    ids=["taylor", "conv3", "local-heads"],
)
def test_padding_anywhere_equals_the_real_tokens_alone(args, short_conv):
    """Left padding and padding between real tokens: each row's logits at its real tokens
    are those of its real tokens alone, at positions 0, 1, ... by default, or at the
    positions given (they move with their tokens)."""
    model = lm(kernel_args=args, short_conv=short_conv)
    for p in model.parameters():  # large enough that positions and taps show
        p.data.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 0, 1, 1]], dtype=torch.bool)
    x = tokens(2, 8)
    given = torch.arange(8).expand(2, 8) + 3
    by_default, at_given = model(x, mask), model(x, mask, positions=given)
    for i in range(2):
        real = mask[i].nonzero()[:, 0]
        alone = model(x[i : i + 1, real])
        assert_rel_close(by_default[i, real], alone[0], 1e-12, f"row {i}, default positions")
        alone = model(x[i : i + 1, real], positions=given[i, real])
        assert_rel_close(at_given[i, real], alone[0], 1e-12, f"row {i}, given positions")


@pytest.mark.parametrize(
    ("kernel", "args", "caches", "short_conv"),
    [(*d, 0) for d in DECODERS] + [(*d, 3) for d in CONV_DECODERS],
    ids=DECODER_IDS + [f"{k}-conv3" for k, _, _ in CONV_DECODERS],
)
def test_cached_decoding_equals_forward(kernel, args, caches, short_conv):
    model = lm(kernel, args, short_conv=short_conv)
    n_prompt, n, lengths = 6, 11, [6, 2, 4]
    x = tokens(3, n)
    mask = lengths_mask(lengths, n_prompt)
    for kind in caches:
        cache = model.new_caches(kind)
        assert isinstance(cache[0], StateCache if kind == "state" else KVCache)
        positions = torch.arange(n_prompt).expand(3, n_prompt)
        steps = [model.decode(x[:, :n_prompt], cache, positions, mask)]
        for t in range(n - n_prompt):
            pos = torch.tensor(lengths)[:, None] + t
            steps.append(model.decode(x[:, n_prompt + t : n_prompt + t + 1], cache, pos))
        got = torch.cat(steps, dim=1)
        for i, m in enumerate(lengths):
            idx = torch.tensor(list(range(m)) + list(range(n_prompt, n)))
            ref = model(x[i : i + 1, idx])
            assert_rel_close(got[i : i + 1, idx], ref, 1e-9, f"{kind} cache, item {i}")


def test_learned_positions_given_are_checked():
    model = lm(pos_embedding="learned", max_len=8)
    x = tokens(1, 4)
    model(x, positions=torch.tensor([0, 1, 2, 7]))  # the last row of the table
    with pytest.raises(ValueError, match=r"cover max_len=8 tokens; got a sequence of 9"):
        model(x, positions=torch.tensor([0, 1, 2, 8]))
    with pytest.raises(ValueError, match=r"positions must be >= 0; got a position of -1"):
        model(x, positions=torch.tensor([-1, 0, 1, 2]))  # (it would read the table's end)


def test_positions_and_decode_inputs_are_checked_by_name():
    model = lm()
    x = tokens(2, 5)
    with pytest.raises(ValueError, match=r"positions must be \(B, N\) = \(2, 5\) or \(N,\)"):
        model(x, positions=torch.arange(4))
    with pytest.raises(TypeError, match=r"positions must be an integer tensor"):
        model(x, positions=torch.arange(5.0))
    caches = model.new_caches()
    with pytest.raises(ValueError, match=r"tokens must be ids in \[0, vocab_size=23\)"):
        model.decode(x + V, caches, torch.arange(5))
    with pytest.raises(ValueError, match=r"positions must be \(B, N\) = \(2, 5\)"):
        model.decode(x, caches, torch.arange(5)[None].expand(3, 5))
    assert model.decode(x, caches, torch.arange(5)).shape == (2, 5, V)


def _greedy_by_forward(model, prompt_rows, steps):
    out = []
    for row in prompt_rows:
        seq = row.clone()
        for _ in range(steps):
            nxt = model(seq[None])[0, -1].argmax()
            seq = torch.cat([seq, nxt[None]])
        out.append(seq[len(row) :])
    return torch.stack(out)


# prompt masks of three rows of 5 slots: real tokens (1) right-padded, left-padded, and with
# padding between them (each row its own real tokens alone: 5, 1 and 3 of them)
PROMPT_MASKS = {
    "right": [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]],
    "left": [[1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [0, 0, 1, 1, 1]],
    "between": [[1, 1, 1, 1, 1], [0, 0, 1, 0, 0], [1, 0, 1, 0, 1]],
}


@pytest.mark.parametrize(
    "kernel, short_conv, layout",
    [
        ("taylorshift", 0, "right"),
        ("softmax", 0, "right"),
        ("linear", 0, "right"),
        ("taylorshift", 4, "right"),
        ("taylorshift", 4, "left"),
        ("softmax", 0, "left"),
        ("taylorshift", 0, "between"),
    ],
)
def test_greedy_generate_equals_rerunning_forward(kernel, short_conv, layout):
    """Each row continues its real tokens alone, wherever the prompt's padding sits."""
    model = lm(kernel, short_conv=short_conv)
    x, mask = tokens(3, 5, seed=4), torch.tensor(PROMPT_MASKS[layout], dtype=torch.bool)
    got = model.generate(x, 6, prompt_mask=mask, temperature=0)
    ref = _greedy_by_forward(model, [x[i, mask[i]] for i in range(3)], 6)
    assert torch.equal(got, ref)
    assert torch.equal(got, model.generate(x, 6, prompt_mask=mask, top_k=1))


def test_state_and_kv_caches_generate_the_same_text():
    model = lm("taylorshift", {"mode": "efficient"})
    x = tokens(2, 7)
    kw = dict(temperature=0.8, top_k=5)
    a = model.generate(x, 9, cache="state", generator=torch.Generator().manual_seed(0), **kw)
    b = model.generate(x, 9, cache="kv", generator=torch.Generator().manual_seed(0), **kw)
    assert torch.equal(a, b) and a.shape == (2, 9)
    assert ((a >= 0) & (a < V)).all()


def test_top_k_restricts_the_choice():
    model = lm()
    x = tokens(4, 3)
    first = model(x)[:, -1].topk(2, dim=-1).indices
    got = model.generate(x, 1, top_k=2, temperature=5.0, generator=torch.Generator().manual_seed(1))
    assert all(int(got[i, 0]) in first[i].tolist() for i in range(4))


@pytest.mark.parametrize(
    ("top_p", "nucleus"), [(0.3, {2}), (0.7, {1, 2}), (0.85, {1, 2, 3}), (1.0, {0, 1, 2, 3})]
)
def test_top_p_samples_from_the_nucleus_in_proportion(top_p, nucleus):
    """Probabilities 0.05, 0.3, 0.5, 0.15 (the most likely not first, so the ranking is
    undone correctly): the fewest most likely tokens holding top_p, drawn as renormalised."""
    from taylorshift.models.causal_lm import _sample

    p = torch.tensor([0.05, 0.3, 0.5, 0.15])
    logits = p.log().expand(20000, 4)
    got = _sample(logits, 1.0, None, top_p, torch.Generator().manual_seed(0))
    assert set(got.unique().tolist()) == nucleus
    share = torch.bincount(got, minlength=4).double() / len(got)
    kept = torch.tensor([i in nucleus for i in range(4)])
    want = torch.where(kept, p, 0.0).double() / p[kept].sum()
    assert torch.allclose(share, want, atol=0.015)  # ~4 standard errors at n = 20,000


def test_generate_takes_any_integer_ids_and_returns_long():
    model = lm()
    x = tokens(2, 5)
    want = model.generate(x, 3, temperature=0)
    for dtype in (torch.uint8, torch.int32, torch.int16):
        assert torch.equal(model.generate(x.to(dtype), 3, temperature=0), want)
        none = model.generate(x.to(dtype), 0)
        assert none.shape == (2, 0) and none.dtype == torch.long
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator or None; got"):
        model.generate(x, 1, generator=5)


def test_extreme_temperatures_keep_their_meaning():
    """An infinite temperature draws uniformly from what top-k and top-p keep (ranked by the
    logits, not flattened into a tie of everything); a tiny one is greedy (not NaN)."""
    from taylorshift.models.causal_lm import _sample

    logits = torch.tensor([0.0, 3.0, 1.0, 2.0, -1.0, 0.5]).expand(20000, 6)
    for temperature in (float("inf"), 3e38):
        got = _sample(logits, temperature, 2, None, torch.Generator().manual_seed(0))
        share = torch.bincount(got, minlength=6).double() / len(got)
        assert set(got.unique().tolist()) == {1, 3}
        assert torch.allclose(share[[1, 3]], torch.tensor([0.5, 0.5], dtype=F64), atol=0.015)
        got = _sample(logits, temperature, None, 0.4, torch.Generator().manual_seed(0))
        assert set(got.unique().tolist()) == {1, 3, 2}  # uniform 1/6 each: the first two hold < 0.4
    for temperature in (1e-40, 1e-30):
        for top_k, top_p in ((None, None), (3, None), (None, 0.9)):
            got = _sample(logits[:4], temperature, top_k, top_p, torch.Generator())
            assert got.tolist() == [1] * 4


def test_top_p_of_one_changes_nothing_and_a_tiny_one_is_greedy():
    model = lm()
    x = tokens(3, 4)
    kw = dict(temperature=2.0)
    plain = model.generate(x, 5, generator=torch.Generator().manual_seed(2), **kw)
    full = model.generate(x, 5, top_p=1.0, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.equal(full, plain)
    tiny = model.generate(x, 5, top_p=1e-6, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.equal(tiny, model.generate(x, 5, temperature=0))
    assert not torch.equal(plain, tiny)  # (the sampled text differs from greedy here)


def test_generate_past_learned_positions_is_refused_before_any_work(monkeypatch):
    """Prompt + max_new_tokens − 1 positions (the last new token is never fed back) must fit
    max_len; the longest row's real tokens count. With eos_id a row may end in time: no
    check up front (the position embedding's own error stays)."""
    model = lm(pos_embedding="learned", max_len=16)
    x, mask = tokens(2, 10), torch.ones(2, 10, dtype=torch.bool)
    mask[1, :5] = False
    assert model.generate(x, 7).shape == (2, 7)  # positions 0 … 15
    calls = []
    real = model.decode
    monkeypatch.setattr(model, "decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    message = r"max_new_tokens=8 after a prompt of 10 tokens needs 17 positions; the learned "
    with pytest.raises(ValueError, match=message + r".*max_len=16: at most 7 new tokens here"):
        model.generate(x, 8, prompt_mask=mask)
    assert not calls
    mask[0, :2] = False  # the longest row now holds 8 real tokens
    assert model.generate(x, 9, prompt_mask=mask).shape == (2, 9)
    with pytest.raises(ValueError, match=r"learned position embeddings cover max_len=16 tokens"):
        model.generate(x, 8, eos_id=V - 1, temperature=0)
    assert lm(max_len=16).generate(x, 30).shape == (2, 30)  # cosine: any length


def test_rows_that_ended_take_no_more_learned_positions():
    """A full-length row that ends at once beside a short row that goes on: the batch runs
    (the ended row is fed its end token at position 0), and the short row's tokens are
    those it makes alone."""
    model = lm(pos_embedding="learned", max_len=8)
    x, mask = tokens(2, 8, seed=3), torch.ones(2, 8, dtype=torch.bool)
    mask[1, :6] = False
    eos = int(model.generate(x[:1], 1, temperature=0)[0, 0])  # row 0's first token
    got = model.generate(x, 6, prompt_mask=mask, eos_id=eos, temperature=0)
    alone = model.generate(x[1:, 6:], 6, eos_id=eos, temperature=0)[0]
    assert got[0].tolist() == [eos] * got.shape[1]
    assert got[1, : len(alone)].tolist() == alone.tolist()
    assert (got[1, len(alone) :] == eos).all()


def test_state_cache_stays_constant_while_kv_cache_grows():
    model = lm("taylorshift")
    sizes = {}
    for kind in ("state", "kv"):
        cache = model.new_caches(kind)
        x = tokens(1, 40)
        model.decode(x[:, :10], cache, torch.arange(10)[None])
        before = sum(c.nbytes for c in cache)
        for t in range(10, 40):
            model.decode(x[:, t : t + 1], cache, torch.tensor([[t]]))
        sizes[kind] = (before, sum(c.nbytes for c in cache))
    assert sizes["state"][0] == sizes["state"][1]
    assert sizes["kv"][1] == 4 * sizes["kv"][0]  # keys, values and mask: 10 -> 40 tokens


def test_caches_of_another_batch_or_model_are_refused():
    """A state cache steps without the op's checks but for its own state's fit: a float32
    model (the CPU kernel's step) given caches of another batch size or width raises
    instead of writing outside the state."""
    model = lm().float()
    caches = model.new_caches("state")
    model.decode(tokens(1, 5), caches, torch.arange(5)[None])
    # (another batch: each layer refuses it before its cache changes; the op-level state
    # check, tests/ops/test_decode.py, stays for callers of the op)
    with pytest.raises(ValueError, match=r"cache holds tokens of a batch of 1 .* batch of 4"):
        model.decode(tokens(4, 1), caches, torch.full((4, 1), 5))
    wider = lm(dim=48, num_heads=3).float()
    with pytest.raises(ValueError, match=r"state must hold sums of shape \(1, 3, 153,"):
        wider.decode(tokens(1, 1), caches, torch.full((1, 1), 5))
    model.decode(tokens(1, 1), caches, torch.full((1, 1), 5))  # its own model still steps


def test_eos_stops_rows_and_generation():
    model = lm()
    x = tokens(2, 4)
    first = model.generate(x, 1, temperature=0)[:, 0]
    got = model.generate(x, 8, temperature=0, eos_id=int(first[0]))
    assert (got[0] == first[0]).all()  # row 0 finished at once, repeats eos


def test_generate_restores_training_mode():
    model = lm().train()
    model.generate(tokens(1, 3), 2)
    assert model.training


def test_save_and_load_round_trip(tmp_path):
    model = lm("linear", tie_embeddings=True)
    path = save_model(model, tmp_path / "lm.safetensors")
    loaded = load_model(path, dtype=F64)
    x = tokens(2, 6)
    assert isinstance(loaded, CausalLM) and loaded.config == model.config
    assert torch.equal(loaded(x), model(x))
    assert loaded.head.weight is loaded.token_embed.weight  # tied after loading too


def test_config_with_the_old_projection_name_loads_renamed():
    # configs saved before the rename of projection "efficient" to "query-only"
    with pytest.warns(FutureWarning, match=r"now called 'query-only'"):
        config = CausalLMConfig.from_dict({"vocab_size": 16, "dim": 8, "depth": 1,
                                           "num_heads": 2, "projection": "efficient"})  # fmt: skip
    assert config.projection == "query-only"
    assert config == CausalLMConfig(vocab_size=16, dim=8, depth=1, num_heads=2,
                                    projection="query-only")  # fmt: skip


def test_registry_presets():
    m = create_model("lm-small", device="meta")
    assert (m.config.depth, m.config.dim, m.config.num_heads) == (4, 128, 4)
    assert create_model("lm-tiny-linear", device="meta").config.attn_kernel == "linear"


def test_bad_input_is_refused():
    model = lm()
    x = tokens(2, 4)
    with pytest.raises(ValueError, match=r"cache='state' needs a kernel with a constant-size"):
        lm("softmax").generate(x, 2, cache="state")
    with pytest.raises(ValueError, match=r"cache='state' needs .* with order=4"):
        lm("taylorshift", {"order": 4, "mode": "direct"}).new_caches("state")
    with pytest.raises(ValueError, match=r"cache must be one of"):
        model.generate(x, 2, cache="paged")
    with pytest.raises(ValueError, match=r"prompt_mask must hold at least one real .* row 1"):
        model.generate(x, 2, prompt_mask=torch.tensor([[True] * 4, [False] * 4]))
    with pytest.raises(ValueError, match=r"prompt_mask must be \(B, N\) = \(2, 4\); got \(2, 3\)"):
        model.generate(x, 2, prompt_mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"max_new_tokens must be an int >= 0; got -1"):
        model.generate(x, -1)
    with pytest.raises(ValueError, match=r"temperature must be a number >= 0"):
        model.generate(x, 1, temperature=-1.0)
    with pytest.raises(ValueError, match=r"top_k must be a positive int or None; got 0"):
        model.generate(x, 1, top_k=0)
    with pytest.raises(TypeError, match=r"top_k must be a positive int or None; got 2.0"):
        model.generate(x, 1, top_k=2.0)
    with pytest.raises(ValueError, match=r"eos_id must be an int in \[0, 22\] or None; got 23"):
        model.generate(x, 1, eos_id=V)
    for top_p in (0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\] or None; got"):
            model.generate(x, 1, top_p=top_p)
    with pytest.raises(TypeError, match=r"temperature must be a number >= 0; got 'hot'"):
        model.generate(x, 1, temperature="hot")
    with pytest.raises(ValueError, match=r"tokens must be ids in \[0, vocab_size=23\)"):
        model(x + V)
    with pytest.raises(ValueError, match=r"tokens must be token ids of shape \(B, N\)"):
        model(x[0])
    with pytest.raises(ValueError, match=r"projection must be one of"):
        CausalLMConfig(projection="super")
    with pytest.raises(TypeError, match=r"CausalLMConfig has no setting 'num_classes'"):
        CausalLMConfig().replace(num_classes=3)
    assert model.generate(x, 0).shape == (2, 0)


@pytest.mark.parametrize(("kernel", "args", "caches"), DECODERS, ids=DECODER_IDS)
def test_decoding_in_blocks_equals_forward(kernel, args, caches):
    """Several new tokens per call after a past (the general mask of the key/value cache)."""
    model = lm(kernel, args)
    x = tokens(2, 13)
    ref = model(x)
    for kind in caches:
        cache = model.new_caches(kind)
        got = [model.decode(x[:, t : t + 3], cache, torch.arange(t, min(t + 3, 13)).expand(2, -1))
               for t in range(0, 13, 3)]  # fmt: skip
        assert_rel_close(torch.cat(got, dim=1), ref, 1e-9, f"{kind} cache")


def test_token_embedding_starts_at_token_init_std_unless_tied():
    big = dict(vocab_size=4000, dim=64, depth=1, num_heads=2)
    assert abs(CausalLM(CausalLMConfig(**big)).token_embed.weight.std().item() - 1.0) < 0.05
    low = CausalLM(CausalLMConfig(token_init_std=0.1, **big)).token_embed.weight.std().item()
    assert abs(low - 0.1) < 0.005
    tied = CausalLM(CausalLMConfig(tie_embeddings=True, **big)).token_embed.weight.std().item()
    assert abs(tied - 0.02) < 0.002
    with pytest.raises(ValueError, match=r"token_init_std must be a number > 0"):
        CausalLMConfig(token_init_std=-1.0)
