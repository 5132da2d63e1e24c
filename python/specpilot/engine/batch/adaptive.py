"""Adaptive per-request verify length (the third batching mechanism).

The drafter always drafts its whole block; each request then verifies only a prefix of it:
  p[r, k]  acceptance estimate of draft k given drafts 1..k-1 accepted: sigmoid(w_k * margin + b_k),
           margin = the draft's top-2 logit gap at position k (one logistic per position, fitted
           online by Newton steps on the observed labels, refit every few steps; w = 0, b = 1.5 at start)
  s[r, k]  survival = prod_{j <= k} p[r, j]: the chance draft k is accepted
  budget   S* = argmax_S (R + sum of the S largest s) / cost(R + S): expected tokens per second of
           step time, cost from a StepCostTable (R requests each verify their anchor, whose bonus is sure)
  lengths  the global top-S* (r, k) slots by survival (ties: lower k, then lower r); since s falls
           with k, each request's admitted slots are a prefix: verify length 1 + n_r
Lossless: a shorter verify only accepts fewer drafts; every committed token is still the target's
(greedy: its argmax; sampled: rejection sampling over the verified prefix, exact for any prefix).
"""
from __future__ import annotations

import bisect
import math
from collections import deque

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


def verify_lengths(survivals: list, costs: StepCostTable) -> list:
    """survivals: per request a float64 tensor [K_r] (nonincreasing) -> verify lengths 1 + n_r."""
    requests = len(survivals)
    slots = sorted(((-float(s[k]), k, r) for r, s in enumerate(survivals) for k in range(len(s))))
    best_s, best_rate, expected = 0, requests / costs.cost(requests), float(requests)
    for count, (neg, _, _) in enumerate(slots, start=1):
        expected -= neg
        rate = expected / costs.cost(requests + count)
        if rate > best_rate:
            best_s, best_rate = count, rate
    admitted = [0] * requests
    for _, _, r in slots[:best_s]:
        admitted[r] += 1
    return [1 + n for n in admitted]
