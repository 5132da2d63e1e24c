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
        # the last KEEP (margin, label) observations per position, in ring buffers
        self._margins, self._labels = np.zeros((positions, KEEP)), np.zeros((positions, KEEP))
        self._count, self._next = np.zeros(positions, dtype=np.int64), np.zeros(positions, dtype=np.int64)

    def observations(self, k: int) -> tuple:
        """(margins, labels) kept for position k + 1 (0-based k), oldest first."""
        n, at = int(self._count[k]), int(self._next[k])
        order = np.arange(at - n, at) % KEEP
        return self._margins[k, order], self._labels[k, order]

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
            i, at = k - 1, int(self._next[k - 1])
            self._margins[i, at], self._labels[i, at] = float(margins[k - 1]), 1.0 if k <= accepted else 0.0
            self._next[i], self._count[i] = (at + 1) % KEEP, min(self._count[i] + 1, KEEP)

    def refit(self) -> None:
        """A few Newton (IRLS) steps per position with a small ridge, every position at once (a refit
        runs inside a step: a per-position loop over the observations as Python tuples took ~30 ms on
        a host at 15 positions x 4096 observations); a fit whose slope comes out negative (a larger
        margin meaning less acceptance) is refused and the old one kept."""
        ks = [k for k in range(len(self.w)) if self._count[k] >= MIN_OBSERVATIONS]
        if not ks:
            return
        m, y = self._margins[ks], self._labels[ks]                 # the ring buffers (order does not matter)
        seen = (np.arange(KEEP)[None, :] < self._count[ks][:, None]).astype(np.float64)
        w, b = np.array([self.w[k] for k in ks]), np.array([self.b[k] for k in ks])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for _ in range(8):
                p = 1.0 / (1.0 + np.exp(-(w[:, None] * m + b[:, None])))
                r, s = (p - y) * seen, p * (1 - p) * seen
                g_w, g_b = (r * m).sum(1) + RIDGE * w, r.sum(1) + RIDGE * b
                h_ww, h_wb, h_bb = (s * m * m).sum(1) + RIDGE, (s * m).sum(1), s.sum(1) + RIDGE
                det = h_ww * h_bb - h_wb * h_wb                     # the 2 x 2 Hessian per position, solved
                step_w, step_b = (h_bb * g_w - h_wb * g_b) / det, (h_ww * g_b - h_wb * g_w) / det
                w, b = w - step_w, b - step_b
                if np.all(np.abs(step_w) < 1e-9) and np.all(np.abs(step_b) < 1e-9):
                    break                                           # converged (it starts from the last fit)
        for i, k in enumerate(ks):
            if math.isfinite(w[i]) and math.isfinite(b[i]) and w[i] >= 0:
                self.w[k], self.b[k] = float(w[i]), float(b[i])


def top2_margin(draft_logits: torch.Tensor) -> torch.Tensor:
    """draft logits [K, V] -> the top-2 gap per row [K] (fp32, on the host). The top two are taken in
    the logits' own dtype (exact values; no fp32 copy of all the logits), their gap in fp32."""
    top = torch.topk(draft_logits, 2, dim=-1).values.float()
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
