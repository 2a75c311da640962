"""The key/value cache: what it holds against torch.cat of the tokens given, its buffers
(written in place, grown by an eighth and KV_CACHE_ROOM tokens when full), its byte
counts."""

from __future__ import annotations

import torch

from taylorshift.nn import KVCache
from taylorshift.nn.cache import KV_CACHE_ROOM

B, H, D, DV = 2, 3, 4, 5


def tokens(t: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    key = torch.randn(B, H, t, D, generator=g)
    value = torch.randn(B, H, t, DV, generator=g)
    mask = torch.rand(B, t, generator=g) > 0.3
    return key, value, mask


def test_cache_holds_the_tokens_given_in_order_across_growth():
    cache = KVCache()
    keys, values, masks = [], [], []
    sizes = [5, 1, 60, 1, 200, 3, 1]  # past the first buffer's room and the second's
    for i, t in enumerate(sizes):
        key, value, mask = tokens(t, i)
        got = cache.extend(key, value, mask if i % 2 else None)
        keys.append(key)
        values.append(value)
        masks.append(mask if i % 2 else torch.ones(B, t, dtype=torch.bool))
        want = torch.cat(keys, 2), torch.cat(values, 2), torch.cat(masks, 1)
        for name, a, e in zip(("keys", "values", "mask"), got, want, strict=True):
            assert torch.equal(a, e), f"{name} after {i + 1} extensions"
        assert cache.length == sum(sizes[: i + 1])
    assert cache.padded  # a given mask held padding


def test_a_step_writes_in_place_until_the_buffer_is_full():
    cache = KVCache()
    cache.extend(*tokens(100, 0)[:2], None)
    room = cache.key_buffer.shape[2]
    assert room == 100 + 100 // 8 + KV_CACHE_ROOM
    buffer = cache.key_buffer
    for step in range(room - 100):
        cache.extend(*tokens(1, step + 1)[:2], None)
        assert cache.key_buffer is buffer, f"step {step} moved the buffer"
    cache.extend(*tokens(1, 999)[:2], None)  # full: moved to a larger one
    assert cache.key_buffer is not buffer
    assert cache.key_buffer.shape[2] == room + 1 + (room + 1) // 8 + KV_CACHE_ROOM


def test_byte_counts_are_the_tokens_and_the_buffers():
    cache = KVCache()
    assert cache.nbytes == cache.reserved_nbytes == 0 and cache.keys is None
    cache.extend(*tokens(10, 0)[:2], None)
    n, room = 10, 10 + 10 // 8 + KV_CACHE_ROOM
    per_token = B * H * (D + DV) * 4 + B  # float32 keys and values, a bool per row
    assert cache.nbytes == n * per_token
    assert cache.reserved_nbytes == room * per_token
