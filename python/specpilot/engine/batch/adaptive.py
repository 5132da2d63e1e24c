"""Adaptive verify length (the third batching mechanism).

The drafter always drafts its whole block; each step then verifies only a prefix of every block, one
length T for the whole step, chosen BEFORE the verify forward from what the host already knows, so the
verify is launched right after the draft with no read-back between them (a read of this step's draft,
e.g. its logit margins, would stall the GPU every step):
  p[k]  the conditional acceptance rate of draft k (1-based) given drafts 1..k-1 accepted, pooled over
        every request: the posterior mean of a Beta-Bernoulli per position over the steps' labels
        (draft k is "at risk" when it was verified and drafts 1..k-1 were accepted; a success when it
        was accepted too), counts discounted by HALF_LIFE_STEPS so the rate follows the running mix
  S[k]  survival = p[1] * ... * p[k]: the chance a step accepts draft k. The product of the pooled
        conditional rates is the Kaplan-Meier estimate of the mean survival over the requests; the
        step's objective sums survivals over its requests, so this mean is what it needs (a per-request
        curve would only help to tell this step's requests from the pool's)
  T*    the verify rows per request that maximise expected tokens per second of step time:
        (sum over requests r of 1 + S[1] + ... + S[min(T, rows_r) - 1]) / cost(R x T + P), T among
        verify_row_choices(block), P the prompt rows of newcomers' chunks riding in the same forward,
        cost from a StepCostTable measured on the card (profile.py), with the host's share of a step
        learnt from the engine's own steps (StepCostTable.observe_step). A chunk step is priced with
        its chunk: past the ridge its verify rows cost compute, so it verifies shorter prefixes where
        a decode step would not (the closed-loop model at the H100's ceilings, Qwen3-8B shape, tau
        6.47, 256 new tokens: 4.17 -> 4.25x at C = 16, docs/design.md section 13)
The labels come from the accepted counts, which the step's one read-back brings to the host anyway;
the counts fold into the rates once per step after the accept loop (O(block), no refit). Censoring:
a trimmed step labels only the drafts it verified; its T depends on earlier steps only, never on
this step's outcome, so the censoring is independent of the outcome (Kaplan-Meier's condition for
a consistent estimate; the choice from this step's own margins would not have been).
Prior: position 1's rate starts at PRIOR_MEAN (optimistic: the first steps verify whole blocks, whose
labels are uncensored) and position k's prior mean is position k-1's rate, each of strength
PRIOR_STRENGTH pseudo-observations: a position with few labels (early on, or past the verified
prefix, where the discounting lets old labels fade) borrows its neighbour's rate instead of a
fixed guess, so trimming starts after a few steps. Exploration: every
BatchConfig.adaptive_probe_every-th step chooses T again with every draft past the first choice's
taken as surely accepted (an upper bound on what they could add), so the positions past T get fresh
labels whenever they could pay, and never when even the bound does not (a prefix rejected for sure).
One T for the whole step, not one per request: a graphed verify forward is dense (R requests x T
rows, padded), so a request verifying fewer rows than T would save no work, only lose tokens.
Lossless: a shorter verify only accepts fewer drafts; every committed token is still the target's
(greedy: its argmax; sampled: rejection sampling over the verified prefix, exact for any prefix).
"""
from __future__ import annotations

import bisect

import numpy as np

PRIOR_MEAN = 0.9          # position 1's rate before any label (optimistic: whole blocks first)
PRIOR_STRENGTH = 4.0      # pseudo-observations of each position's prior
HALF_LIFE_STEPS = 32      # steps after which a label weighs half (about a request's life at tau ~6)


HOST_WEIGHT = 0.1          # the weight of a step's newest residual in StepCostTable.host_s


class StepCostTable:
    """Step seconds as a function of the verify rows of the step: a step function over measured token
    buckets (a row count costs its bucket's time; past the last bucket, linear in rows), plus a fixed
    part that the verify length does not change: the draft (fixed_s, timed with the forwards) and the
    host's share of a step (host_s: its layout, uploads, read-back and accept loop, which the device's
    forwards do not hide), learnt from the engine's own decode steps (observe_step)."""

    def __init__(self, points, fixed_s: float = 0.0):
        points = sorted((int(n), float(s)) for n, s in points)
        if not points or any(n < 1 or s <= 0 for n, s in points) or fixed_s < 0:
            raise ValueError(f"a step-cost table needs (tokens >= 1, seconds > 0) points and fixed_s >= 0, "
                             f"got {points[:4]}, {fixed_s}")
        self.tokens = [n for n, _ in points]
        self.seconds = [s for _, s in points]
        self.fixed_s = fixed_s
        self.host_s = 0.0
        self.in_seconds = True          # the roofline's costs have no unit: it learns no host share

    @classmethod
    def roofline(cls, ridge_tokens: int) -> "StepCostTable":
        """The shape of a GPU forward: flat (weight-bandwidth bound) up to `ridge_tokens` rows, then
        linear (compute bound). For a card without a profile."""
        table = cls([(ridge_tokens, 1.0)], fixed_s=0.0)
        table.in_seconds = False
        return table

    def cost(self, rows: int) -> float:
        return self.host_s + self.device_cost(rows)

    def device_cost(self, rows: int) -> float:
        i = bisect.bisect_left(self.tokens, rows)
        if i < len(self.tokens):
            return self.fixed_s + self.seconds[i]
        return self.fixed_s + self.seconds[-1] * rows / self.tokens[-1]

    def observe_step(self, seconds: float, rows: int) -> None:
        """A decode step took `seconds` of wall time at `rows` verify rows: what the forwards' times do
        not explain folds into host_s (an exponential mean). Without it a host-bound deployment, whose
        verify is a small part of its step, trims rows for a saving its steps never see (the zoo pair
        at C=1 on an H100: 0.75x with adaptive verify, 0.83x without). The roofline learns nothing."""
        if self.in_seconds:
            self.host_s += HOST_WEIGHT * (max(0.0, seconds - self.device_cost(rows)) - self.host_s)


class AcceptanceEstimator:
    """The pooled per-position acceptance rates of the module docstring. `observe` records one verified
    request of the current step (host ints, O(1)); `end_step` folds the step's labels into the
    discounted counts and recomputes the rates; `survival` is what a step's choice reads."""

    def __init__(self, positions: int, prior_mean: float = PRIOR_MEAN, prior_strength: float = PRIOR_STRENGTH,
                 half_life_steps: float = HALF_LIFE_STEPS):
        if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
            raise ValueError(f"AcceptanceEstimator positions={positions!r} must be an int >= 1")
        if not 0.0 < prior_mean <= 1.0 or prior_strength <= 0 or half_life_steps <= 0:
            raise ValueError(f"AcceptanceEstimator needs 0 < prior_mean <= 1, prior_strength > 0 and "
                             f"half_life_steps > 0, got {prior_mean}, {prior_strength}, {half_life_steps}")
        self.positions = positions
        self.prior_mean, self.prior_strength = float(prior_mean), float(prior_strength)
        self.decay = 0.5 ** (1.0 / half_life_steps)
        self.at_risk = np.zeros(positions)           # discounted count of labels per position
        self.accepted = np.zeros(positions)          # ... of which accepted
        self._pending = []                           # this step's (verified drafts, accepted drafts)
        self._rates()

    def observe(self, admitted: int, accepted: int) -> None:
        """One request of this step verified `admitted` drafts and accepted the first `accepted`: drafts
        1..min(accepted + 1, admitted) were at risk, 1..accepted accepted (a later draft unobserved)."""
        if not 0 <= accepted <= admitted <= self.positions:
            raise ValueError(f"observe: need 0 <= accepted ({accepted}) <= admitted ({admitted}) <= "
                             f"{self.positions} positions")
        self._pending.append((min(accepted + 1, admitted), accepted))

    def end_step(self) -> None:
        """Folds this step's labels into the counts (older labels discounted by one step) and the rates."""
        self.at_risk *= self.decay
        self.accepted *= self.decay
        if self._pending:
            labels = np.asarray(self._pending, dtype=np.int64)
            self._pending = []
            # a request at risk up to position n counts once at each of 1..n: a reversed cumulative sum
            # of how many requests stop at each n
            size = self.positions + 1
            self.at_risk += np.cumsum(np.bincount(labels[:, 0], minlength=size)[::-1])[::-1][1:]
            self.accepted += np.cumsum(np.bincount(labels[:, 1], minlength=size)[::-1])[::-1][1:]
        self._rates()

    def _rates(self) -> None:
        rates, prior = np.empty(self.positions), self.prior_mean
        for k in range(self.positions):           # a chain: each position's prior is its predecessor's rate
            prior = (self.accepted[k] + self.prior_strength * prior) / (self.at_risk[k] + self.prior_strength)
            rates[k] = prior
        self.rates = rates
        self.survival = np.cumprod(rates)


def verify_row_choices(block: int) -> tuple:
    """The verify rows per request a step may choose: the quarters of the block (the block itself
    always), each a captured CUDA graph."""
    return tuple(sorted({max(1, round(block * q / 4)) for q in (1, 2, 3, 4)}))


def survival_matrix(estimator: AcceptanceEstimator, drafts: list, sure_after: int | None = None) -> np.ndarray:
    """drafts: per request its draft count (block rows - 1) -> survivals [R, K] (K = the most drafts;
    the pooled curve, 0 past a request's own drafts), float64. sure_after = n: every draft past the
    first n taken as accepted for sure (rate 1), the most the unverified positions could add."""
    width = max(drafts, default=0)
    if width > estimator.positions:
        raise ValueError(f"survival_matrix: a request drafted {width} tokens, the estimator knows "
                         f"{estimator.positions} positions")
    if width == 0:
        return np.zeros((len(drafts), 0))
    curve = estimator.survival[:width]
    if sure_after is not None and sure_after < width:
        curve = curve.copy()
        curve[sure_after:] = curve[sure_after - 1] if sure_after > 0 else 1.0
    have = np.arange(width)[None, :] < np.asarray(drafts)[:, None]
    return np.where(have, curve[None, :], 0.0)


def choose_verify_rows(survivals: np.ndarray, padded_requests: int, choices: tuple, costs: StepCostTable,
                       prefill_rows: int = 0) -> int:
    """T* of the module docstring: survivals [R, K] (0 past each request's drafts), the step's
    requests padded to its graph bucket (what the forward computes), T among `choices`; ties go to
    the longer T. prefill_rows: the newcomers' prompt rows that ride in the same forward; they are
    priced with the verify rows (past the ridge a chunk makes every verify row cost compute)."""
    requests = survivals.shape[0]
    cum = np.concatenate([np.zeros((requests, 1)), np.cumsum(survivals, axis=1)], axis=1)   # [R, K + 1]
    best, best_rate = None, -1.0
    for t in sorted(choices):
        expected = requests + cum[:, min(t - 1, cum.shape[1] - 1)].sum()
        rate = expected / costs.cost(padded_requests * t + prefill_rows)
        if rate >= best_rate:
            best, best_rate = t, rate
    return best


def choose_step_rows(estimator: AcceptanceEstimator, drafts: list, padded_requests: int, choices: tuple,
                     costs: StepCostTable, probe: bool = False, prefill_rows: int = 0) -> int:
    """The step's verify rows per request from host state alone: T* of the estimate over requests with
    `drafts` drafts each (and the step's prefill rows priced beside them); on a probe step, T* again
    with every draft past that T* surely accepted."""
    rows = choose_verify_rows(survival_matrix(estimator, drafts), padded_requests, choices, costs, prefill_rows)
    if probe:
        bound = survival_matrix(estimator, drafts, sure_after=rows - 1)
        rows = choose_verify_rows(bound, padded_requests, choices, costs, prefill_rows)
    return rows
