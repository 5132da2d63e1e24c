"""Sampling and rejection sampling, step for step as dflash 0.1.0 (`_sampling_probs`,
`_sample_probs`, `_rejection_sample`), with an explicit torch.Generator instead of the global RNG.

Exactness: same operations in the same order, and the same random draws in the same order, so with a
generator seeded s the draws equal stock's after `torch.manual_seed(s)`; rejection sampling is
lossless (the committed tokens are distributed as the target's sampling distribution).
"""
from __future__ import annotations

import torch


def validate_sampling(temperature: float, top_p: float = 1.0, top_k: int = 0) -> None:
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"temperature={temperature} and top_k={top_k} must be non-negative and "
                         f"top_p={top_p} in (0, 1]")


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """logits [..., V] -> fp32 probabilities [..., V] after temperature, top-k and top-p."""
    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    indices = None
    if 0 < top_k < vocab:
        scores, indices = torch.topk(scores, top_k, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if indices is not None:
        probs = torch.zeros_like(logits, dtype=probs.dtype).scatter(-1, indices, probs)
    return probs


def sample_probs(probs: torch.Tensor, generator=None) -> torch.Tensor:
    """probs [..., V] -> token ids [...] (one multinomial draw per row, rows in order)."""
    shape = probs.shape[:-1]
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(shape)


def sample(logits: torch.Tensor, temperature: float, generator=None, top_p: float = 1.0, top_k: int = 0):
    """Greedy (argmax) at temperature 0, else one draw from sampling_probs. logits [..., V] -> [...]."""
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    return sample_probs(sampling_probs(logits, temperature, top_p, top_k), generator)


def rejection_sample(draft_tokens, target_probs, draft_probs, generator=None):
    """draft_tokens [1, K], target_probs [1, K+1, V], draft_probs [1, K, V] -> (accepted, next token).

    Accept draft i with probability min(1, p_i / q_i) (as `rand * q < p`), stop at the first
    rejection and resample from the normalised residual max(p - q, 0) (p itself when it is all zero);
    after K acceptances the bonus is drawn from p at position K.
    """
    k = draft_tokens.shape[1]
    p = target_probs[:, :k].gather(-1, draft_tokens[..., None])[..., 0]    # [1, K]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]            # [1, K]
    u = torch.rand(q.shape, generator=generator, device=q.device, dtype=q.dtype)
    accepted = int((u * q < p).to(torch.int32).cumprod(-1).sum(-1)[0].item())
    if accepted == k:
        return accepted, sample_probs(target_probs[:, -1], generator)[0]
    residual = residual_probs(target_probs[0, accepted], draft_probs[0, accepted])
    return accepted, sample_probs(residual[None], generator)[0]


def residual_probs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """p, q [V] -> normalised max(p - q, 0), or p when that is all zero (stock's residual)."""
    residual = (p - q).clamp_min(0)
    total = residual.sum()
    return torch.where(total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny), p)
