"""Decoder-only causal language model with ``generate()``.

token embedding (+ positions) -> ``depth`` pre-norm causal ``Block``s -> LayerNorm ->
LM head (optionally tied to the token embedding). Layout: token ids (B, N), logits
(B, N, vocab_size). Padded batches pass a padding mask (B, N), True = real token:
padded tokens are never attended and their logits are not meaningful. The padding may sit
anywhere (right, left, between real tokens): ``forward`` runs on each row's real tokens
moved to the front in their order and puts the rows back, so a row's logits at its real
tokens are those of its real tokens alone, at positions 0, 1, … (or the ``positions``
given, which move with their tokens).

``generate`` prefills the prompt in one pass, then decodes token by token with a cache per
layer: TaylorShift and linear attention carry a constant-size state (O(H · d² · dv) per
layer whatever the context), any kernel can use a key/value cache (``cache="kv"``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .._inference import inference_only
from .._validate import check_bool, check_int, check_number, value_range, values_readable
from ..nn import CACHE_KINDS
from ..ops.masks import padding_inside, permute_tokens, real_tokens_first
from .encoder import (
    TrunkConfig,
    check_padding_mask,
    init_linear_layers,
    position_embedding,
    transformer_blocks,
)
from .registry import register_model_class

DECODE_PROJECTIONS = ("standard", "optimized", "query-only")


@dataclass(frozen=True)
class CausalLMConfig(TrunkConfig):
    """Settings of ``CausalLM``; every field is saved with the weights.

    Args:
        dim, depth, num_heads, mlp_ratio, qkv_bias, qk_norm, attn_kernel, kernel_args,
            pos_embedding, dropout, attn_drop, drop_path: as ``TrunkConfig``
            (``taylorshift.models.encoder``).
        projection: ``standard``, ``optimized`` or ``query-only`` (``super`` fixes the
            context length and cannot decode token by token).
        short_conv: taps of the causal short convolution on q, k, v in every attention layer
            (``taylorshift.nn.Attention``); 0: none. Decoding carries its last inputs.
        vocab_size: token ids are in ``[0, vocab_size)`` (258: bytes, pad, cls).
        max_len: the longest sequence of ``pos_embedding="learned"``.
        token_init_std: standard deviation of the token embedding at initialisation,
            N(0, std²): 1 (default) matches the unit amplitude of the cosine position
            embedding; 0.02 (the earlier default) lets positions drown token identity
            (docs/accuracy.md). Tied embeddings start at 0.02 whatever this says (the head's
            logits would start far too large).
        tie_embeddings: the LM head reuses the token embedding matrix (off by default: in
            one unrecorded trial, a tied 1-block width-32 model stayed at the unigram loss
            over 200 steps of byte-level text where the untied one learned).
    """

    projections: ClassVar[tuple[str, ...]] = DECODE_PROJECTIONS

    vocab_size: int = 258
    max_len: int = 2048
    tie_embeddings: bool = False
    token_init_std: float = 1.0

    def validate(self) -> None:
        for name in ("vocab_size", "max_len"):
            check_int(name, getattr(self, name), ge=1)
        check_bool("tie_embeddings", self.tie_embeddings)
        check_number("token_init_std", self.token_init_std, gt=0)
        super().validate()


@register_model_class
class CausalLM(nn.Module):
    """Decoder-only language model over token ids, any attention kernel.

    Args:
        config: a ``CausalLMConfig``.
        device, dtype: where and in which dtype parameters are created.

    Example::

        model = CausalLM(CausalLMConfig(vocab_size=100, dim=64, depth=2))
        logits = model(torch.randint(0, 100, (2, 16)))             # (2, 16, 100)
        new = model.generate(torch.randint(0, 100, (2, 5)), max_new_tokens=8, top_k=10)
    """

    config_class: ClassVar[type[CausalLMConfig]] = CausalLMConfig

    def __init__(self, config: CausalLMConfig, *, device=None, dtype=None):
        super().__init__()
        if not isinstance(config, CausalLMConfig):
            raise TypeError(f"config must be a CausalLMConfig; got {type(config).__name__}")
        fk = {"device": device, "dtype": dtype}
        self.config = config = copy.deepcopy(config)
        dim = config.dim
        self.token_embed = nn.Embedding(config.vocab_size, dim, **fk)
        self.pos_embed = position_embedding(config.pos_embedding, dim, config.max_len, **fk)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = transformer_blocks(config, **fk)
        self.norm = nn.LayerNorm(dim, **fk)
        self.head = nn.Linear(dim, config.vocab_size, bias=False, **fk)
        self.reset_parameters()
        if config.tie_embeddings:
            self.head.weight = self.token_embed.weight

    @classmethod
    def from_config(cls, config: CausalLMConfig | dict[str, Any], *, device=None, dtype=None):
        """Build from a config object or a dict of its fields."""
        if isinstance(config, dict):
            config = CausalLMConfig.from_dict(config)
        return cls(config, device=device, dtype=dtype)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Linear weights ~ N(0, 0.02²) truncated, biases 0, the token embedding ~
        N(0, token_init_std²) (0.02 when tied to the head); the output projections of
        attention and MLP scaled by 1/sqrt(2 · depth) (GPT-2's rule)."""
        init_linear_layers(self)
        if not self.config.tie_embeddings:
            nn.init.normal_(self.token_embed.weight, std=self.config.token_init_std)
        residual_std = 0.02 / (2 * self.config.depth) ** 0.5
        for block in self.blocks:
            nn.init.trunc_normal_(block.attn.proj.weight, std=residual_std)
            nn.init.trunc_normal_(block.mlp.fc2.weight, std=residual_std)

    def _check_tokens(self, name: str, tokens: Tensor) -> None:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"{name} must be token ids of shape (B, N); got {got}")
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"{name} must be integer token ids; got {tokens.dtype}")
        # (torch.compile cannot branch on values while tracing: the range check is eager-only;
        # a compiled graph fails in the embedding instead)
        if not tokens.numel() or not values_readable():
            return
        low, high = value_range(tokens)
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(
                f"{name} must be ids in [0, vocab_size={self.config.vocab_size}); got values in "
                f"[{low}, {high}]"
            )

    def embed(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """Token + position embedding: (B, N) -> (B, N, dim); positions default 0..N-1.
        Token ids of any integer dtype (uint8 bytes too; the lookup takes int32 and int64)."""
        if tokens.dtype not in (torch.int64, torch.int32):
            tokens = tokens.long()
        return self.drop(self.pos_embed(self.token_embed(tokens), positions))

    def forward(
        self,
        tokens: Tensor,
        padding_mask: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Next-token logits (B, N, vocab_size) of token ids (B, N), causally.

        Args:
            tokens: long (B, N).
            padding_mask: bool (B, N), True = real token, padding anywhere (module docs).
            positions: long (B, N) or (N,), the tokens' positions (default 0..N-1).
        """
        self._check_tokens("tokens", tokens)
        check_padding_mask(padding_mask, *tokens.shape)
        _check_positions(positions, *tokens.shape)
        inverse = None
        if padding_mask is not None and padding_inside(padding_mask):
            # padding before or between real tokens: each row's real tokens first (their
            # positions with them), the rows put back at the end (see the module docs)
            order, inverse = real_tokens_first(padding_mask)
            tokens, padding_mask = tokens.gather(1, order), padding_mask.gather(1, order)
            if positions is not None:
                positions = positions.expand(tokens.shape).gather(1, order)
        x = self.embed(tokens, positions)
        for block in self.blocks:
            x = block(x, attn_mask=padding_mask, is_causal=True)
        logits = self.head(self.norm(x))
        return logits if inverse is None else permute_tokens(logits, inverse)

    # Decoding

    def new_caches(self, kind: str = "auto") -> list:
        """One empty decoding cache per block: ``"state"`` (constant size; TaylorShift and
        linear attention), ``"kv"`` (any kernel) or ``"auto"`` (state when the kernel has
        one)."""
        return [block.attn.new_cache(kind) for block in self.blocks]

    @inference_only
    def decode(
        self,
        tokens: Tensor,
        caches: list,
        positions: Tensor,
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, T, vocab_size) of T new tokens after those in ``caches``.

        Row t equals row ``n + t`` of ``forward`` over all real tokens so far; ``caches``
        (from ``new_caches``) are updated in place. ``positions`` long (B, T) or (T,).
        """
        self._check_tokens("tokens", tokens)
        if positions is None:
            raise TypeError("positions must be the new tokens' positions, (B, T); got None")
        _check_positions(positions, *tokens.shape)
        return self._decode(tokens, caches, positions, padding_mask)

    def _decode(self, tokens, caches, positions, padding_mask=None) -> Tensor:
        """``decode`` without its input checks (about 13 µs a step at B = 1, T = 1):
        ``generate``'s loop, which made the tokens and positions itself."""
        x = self.embed(tokens, positions)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block.decode(x, cache, padding_mask)
        return self.head(self.norm(x))

    @inference_only
    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        prompt_mask: Tensor | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        cache: str = "auto",
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue each prompt by up to ``max_new_tokens`` tokens.

        Args:
            prompt: integer (B, N) token ids, padded anywhere when lengths differ (left
                padding, the usual layout for generation, right, or between tokens).
            max_new_tokens: tokens to add.
            prompt_mask: bool (B, N), True = real token; every row holds at least one. A
                row continues its real tokens as if they stood alone, at positions
                0, 1, … in their order.
            temperature: sampling temperature; 0 picks the most likely token (greedy).
            top_k: sample among the k most likely tokens only.
            top_p: nucleus sampling: among the fewest most likely tokens whose
                probabilities (after ``temperature`` and ``top_k``) sum to at least
                ``top_p``, in (0, 1]; the most likely token always stays.
            cache: ``"auto"``, ``"state"`` or ``"kv"`` (see ``new_caches``).
            eos_id: a row that produced this id produces it again until all rows have;
                generation then stops early. Without it, a model with learned position
                embeddings refuses at once a prompt and ``max_new_tokens`` longer than its
                ``max_len`` + 1 (the last new token takes no position).
            generator: random generator of the sampling.

        Returns:
            long (B, T) new tokens, T <= ``max_new_tokens``. The model runs in eval mode
            (restored afterwards).
        """
        self._check_tokens("prompt", prompt)
        b, n = prompt.shape
        self._check_generate(prompt, prompt_mask, max_new_tokens, temperature, top_k, top_p)
        check_int("eos_id", eos_id, ge=0, le=self.config.vocab_size - 1, allow_none=True)
        if eos_id is None:  # (with eos_id a row may end before it needs the positions)
            self._check_positions_suffice(prompt_mask, n, max_new_tokens)
        if cache not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {CACHE_KINDS}; got {cache!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator or None; got {type(generator).__name__}"
            )
        was_training = self.training
        self.eval()
        try:
            caches = self.new_caches(cache)
            if prompt_mask is None:
                positions = torch.arange(n, device=prompt.device).expand(b, n)
                lengths, last = positions[:, -1] + 1, positions[:, -1]
            else:
                # real tokens count 0, 1, … in their order (padding's own positions are
                # never read); the next token follows each row's last real one
                positions = (prompt_mask.cumsum(1) - 1).clamp(min=0)
                lengths = positions[:, -1] + 1
                last = n - 1 - prompt_mask.flip(1).to(torch.int8).argmax(1)
            logits = self.decode(prompt, caches, positions, prompt_mask)
            logits = logits[torch.arange(b, device=prompt.device), last]  # (B, V)
            done = torch.zeros(b, dtype=torch.bool, device=prompt.device)
            out = []
            for t in range(max_new_tokens):
                token = _sample(logits, temperature, top_k, top_p, generator)
                if eos_id is not None:
                    token = torch.where(done, eos_id, token)
                    done |= token == eos_id
                out.append(token)
                if (eos_id is not None and bool(done.all())) or t == max_new_tokens - 1:
                    break
                # a row that has ended is fed its end token at position 0, so that it never
                # runs past learned positions; its outputs are not read
                step_positions = torch.where(done, 0, lengths + t)[:, None]
                logits = self._decode(token[:, None], caches, step_positions)[:, 0]
        finally:
            self.train(was_training)
        if not out:
            return torch.zeros((b, 0), dtype=torch.long, device=prompt.device)
        return torch.stack(out, dim=1)

    def _check_generate(
        self, prompt, prompt_mask, max_new_tokens, temperature, top_k, top_p
    ) -> None:
        b, n = prompt.shape
        check_int("max_new_tokens", max_new_tokens, ge=0)
        check_number("temperature", temperature, ge=0, finite=False)
        check_int("top_k", top_k, ge=1, allow_none=True)
        check_number("top_p", top_p, gt=0, le=1, allow_none=True)
        if n == 0:
            raise ValueError("prompt must hold at least one token per row; got N = 0")
        if prompt_mask is None:
            return
        check_padding_mask(prompt_mask, b, n, "prompt_mask")
        empty = (~prompt_mask.any(1)).nonzero()[:, 0]
        if empty.numel():
            raise ValueError(
                "prompt_mask must hold at least one real token (True) per row; got none in "
                f"row {int(empty[0])}"
            )

    def _check_positions_suffice(self, prompt_mask, n: int, max_new_tokens: int) -> None:
        """Learned position embeddings cover ``max_len`` tokens: refuse a generation that
        would run past them before it starts, not after a part of the work."""
        max_len = self.config.max_len
        if self.config.pos_embedding != "learned":
            return
        longest = n if prompt_mask is None else int(prompt_mask.sum(1).max())
        needed = longest + max_new_tokens - 1  # (the last new token is never fed back)
        if needed > max_len:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} after a prompt of {longest} tokens needs "
                f"{needed} positions; the learned position embeddings cover max_len={max_len}: "
                f"at most {max(max_len - longest + 1, 0)} new tokens here (or a model with "
                f"pos_embedding='cosine', which takes any length)"
            )

    def extra_repr(self) -> str:
        return f"attn_kernel={self.config.attn_kernel!r}"


def _check_positions(positions: Tensor | None, b: int, n: int) -> None:
    """None, or integer positions of shape (B, N), (1, N) or (N,) (learned position
    embeddings check their range)."""
    if positions is None:
        return
    if (
        not isinstance(positions, Tensor)
        or positions.is_floating_point()
        or (positions.dtype == torch.bool)
    ):
        what = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
        raise TypeError(f"positions must be an integer tensor (B, N) or (N,); got {what}")
    if tuple(positions.shape) not in ((n,), (1, n), (b, n)):
        raise ValueError(
            f"positions must be (B, N) = ({b}, {n}) or (N,); got {tuple(positions.shape)}"
        )


def _sample(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator
) -> Tensor:
    """One token id per row of logits (B, V): temperature, then top-k, then top-p.

    Any temperature > 0 works, however large or small: the logits are shifted by the row's
    maximum before the division (a tiny temperature sends the others to -inf, not the
    maximum to inf and softmax to NaN), top-k keeps the k largest raw logits (the ranking
    a temperature does not change, and which an infinite one would flatten into a tie),
    and top-p ranks the tokens by their raw logits too (ties of the scaled probabilities
    broken by them)."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)
    scaled = (logits - logits.amax(-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p is not None and top_p < 1:
        # a token stays while the tokens ranked above it hold less than top_p
        order = logits.argsort(dim=-1, descending=True, stable=True)
        ranked = probs.gather(-1, order)
        drop = (ranked.cumsum(-1) - ranked) >= top_p
        probs = probs.masked_fill(drop.scatter(-1, order, drop), 0.0)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
