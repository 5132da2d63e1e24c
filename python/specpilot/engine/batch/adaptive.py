"""Adaptive verify length (the third batching mechanism).

The drafter always drafts its whole block; each step then verifies only a prefix of every block:
  p[r, k]  acceptance estimate of draft k given drafts 1..k-1 accepted: sigmoid(w_k * margin + b_k),
           margin = the draft's top-2 logit gap at position k (one logistic per position, fitted
           online by Newton steps on the observed labels, refit every few steps; w = 0, b = 1.5 at start)
  s[r, k]  survival = prod_{j <= k} p[r, j]: the chance draft k is accepted
  T*       the verify rows per request that maximise expected tokens per second of step time:
           (sum over requests of 1 + s[r, 1] + ... + s[r, T-1]) / cost(R x T), T among
           verify_row_choices(block), cost from a StepCostTable measured on the card
One T for the whole step, not one per request: a graphed verify forward is dense (R requests x T
rows, padded), so a request verifying fewer rows than T would save no work, only lose tokens.
Lossless: a shorter verify only accepts fewer drafts; every committed token is still the target's
(greedy: its argmax; sampled: rejection sampling over the verified prefix, exact for any prefix).
"""
from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np
import torch

KEEP = 4096          # observations kept per position
MIN_OBSERVATIONS = 50
RIDGE = 1e-3


class StepCostTable:
    """Step seconds as a function of the verify rows of the step: a step function over measured token
    buckets (a row count costs its bucket's time; past the last bucket, linear in rows), plus a fixed
    part (drafting and host work) that the verify length does not change."""

    def __init__(self, points, fixed_s: float = 0.0):
        points = sorted((int(n), float(s)) for n, s in points)
        if not points or any(n < 1 or s <= 0 for n, s in points) or fixed_s < 0:
            raise ValueError(f"a step-cost table needs (tokens >= 1, seconds > 0) points and fixed_s >= 0, "
                             f"got {points[:4]}, {fixed_s}")
        self.tokens = [n for n, _ in points]
        self.seconds = [s for _, s in points]
        self.fixed_s = fixed_s

    @classmethod
    def roofline(cls, ridge_tokens: int) -> "StepCostTable":
        """The shape of a GPU forward: flat (weight-bandwidth bound) up to `ridge_tokens` rows, then
        linear (compute bound). For a card without a profile."""
        return cls([(ridge_tokens, 1.0)], fixed_s=0.0)

    def cost(self, rows: int) -> float:
        i = bisect.bisect_left(self.tokens, rows)
        if i < len(self.tokens):
            return self.fixed_s + self.seconds[i]
        return self.fixed_s + self.seconds[-1] * rows / self.tokens[-1]


class AcceptanceEstimator:
    def __init__(self, positions: int):
        self.w = [0.0] * positions                       # position k = index k - 1
        self.b = [1.5] * positions
        self.obs = [deque(maxlen=KEEP) for _ in range(positions)]

    def probs(self, margins: torch.Tensor) -> torch.Tensor:
        """margins [K] (positions 1..K) -> p [K]."""
        k = margins.shape[0]
        w = torch.tensor(self.w[:k], dtype=torch.float64)
        b = torch.tensor(self.b[:k], dtype=torch.float64)
        return torch.sigmoid(w * margins.double().cpu() + b)

    def observe(self, margins: list, admitted: int, accepted: int) -> None:
        """Labels of one verified request: draft k (1-based) accepted iff k <= accepted, observed while
        its predecessors were all accepted and it was verified (k <= min(accepted + 1, admitted))."""
        for k in range(1, min(accepted + 1, admitted) + 1):
            self.obs[k - 1].append((float(margins[k - 1]), 1.0 if k <= accepted else 0.0))

    def refit(self) -> None:
        """A few Newton (IRLS) steps per position with a small ridge; a fit whose slope comes out
        negative (a larger margin meaning less acceptance) is refused and the old one kept."""
        for k, obs in enumerate(self.obs):
            if len(obs) < MIN_OBSERVATIONS:
                continue
            data = torch.tensor(list(obs), dtype=torch.float64)
            x = torch.stack([data[:, 0], torch.ones(len(obs), dtype=torch.float64)], dim=1)
            y = data[:, 1]
            theta = torch.tensor([self.w[k], self.b[k]], dtype=torch.float64)
            for _ in range(8):
                p = torch.sigmoid(x @ theta)
                grad = x.T @ (p - y) + RIDGE * theta
                hess = (x * (p * (1 - p))[:, None]).T @ x + RIDGE * torch.eye(2, dtype=torch.float64)
                theta = theta - torch.linalg.solve(hess, grad)
            if math.isfinite(theta[0].item()) and math.isfinite(theta[1].item()) and theta[0].item() >= 0:
                self.w[k], self.b[k] = theta[0].item(), theta[1].item()


def top2_margin(draft_logits: torch.Tensor) -> torch.Tensor:
    """draft logits [K, V] -> the top-2 gap per row [K] (fp32, on the host)."""
    top = torch.topk(draft_logits.float(), 2, dim=-1).values
    return (top[:, 0] - top[:, 1]).cpu()


def verify_row_choices(block: int) -> tuple:
    """The verify rows per request a step may choose: the quarters of the block (the block itself
    always), each a captured CUDA graph."""
    return tuple(sorted({max(1, round(block * q / 4)) for q in (1, 2, 3, 4)}))


def survival_matrix(estimator: AcceptanceEstimator, margins: list) -> np.ndarray:
    """margins: per request its drafts' top-2 margins [K_r] -> survivals [R, K] (K = the longest;
    0 past a request's own drafts), float64."""
    width = max((len(m) for m in margins), default=0)
    if width == 0:
        return np.zeros((len(margins), 0))
    m = np.zeros((len(margins), width))
    have = np.zeros((len(margins), width), dtype=bool)
    for r, values in enumerate(margins):
        m[r, :len(values)] = np.asarray(values, dtype=np.float64)
        have[r, :len(values)] = True
    w, b = np.asarray(estimator.w[:width]), np.asarray(estimator.b[:width])
    p = np.where(have, 1.0 / (1.0 + np.exp(-(w * m + b))), 0.0)
    return np.cumprod(p, axis=1)


def choose_verify_rows(survivals: np.ndarray, padded_requests: int, choices: tuple, costs: StepCostTable) -> int:
    """T* of the module docstring: survivals [R, K] (0 past each request's drafts), the step's
    requests padded to its graph bucket (what the forward computes), T among `choices`; ties go to
    the longer T."""
    requests = survivals.shape[0]
    cum = np.concatenate([np.zeros((requests, 1)), np.cumsum(survivals, axis=1)], axis=1)   # [R, K + 1]
    best, best_rate = None, -1.0
    for t in sorted(choices):
        expected = requests + cum[:, min(t - 1, cum.shape[1] - 1)].sum()
        rate = expected / costs.cost(padded_requests * t)
        if rate >= best_rate:
            best, best_rate = t, rate
    return best
