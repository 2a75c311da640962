"""``inference_only``: the decoding methods' no_grad, entered only when grad mode is on."""

from __future__ import annotations

import torch

from taylorshift._inference import inference_only
from taylorshift.models import CausalLM, CausalLMConfig


def test_runs_without_autograd_in_any_grad_mode():
    w = torch.ones(3, requires_grad=True)
    seen = []

    @inference_only
    def scaled(x):
        """Doc."""
        seen.append(torch.is_grad_enabled())
        return x * w

    assert scaled.__name__ == "scaled" and scaled.__doc__ == "Doc."
    assert not scaled(torch.ones(3)).requires_grad  # grad mode on: turned off inside
    assert torch.is_grad_enabled()  # and on again after
    with torch.no_grad():
        assert not scaled(torch.ones(3)).requires_grad
    with torch.inference_mode():
        assert not scaled(torch.ones(3)).requires_grad
    assert seen == [False, False, False]
    assert (w * torch.ones(3)).requires_grad  # (the control: outside, autograd records)


def test_decoding_a_model_with_grad_mode_on_records_no_graph():
    torch.manual_seed(0)
    config = CausalLMConfig(vocab_size=11, dim=16, depth=2, num_heads=2, attn_kernel="taylorshift")
    model = CausalLM(config)
    for kind in ("state", "kv"):
        caches = model.new_caches(kind)
        prompt = torch.randint(0, 11, (1, 5))
        logits = model.decode(prompt, caches, torch.arange(5).expand(1, 5))
        step = model.decode(prompt[:, :1], caches, torch.full((1, 1), 5))
        assert not logits.requires_grad and not step.requires_grad
    assert model(prompt).requires_grad  # (the control: the forward pass records)
