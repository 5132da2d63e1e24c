"""The verdict's rules: when a disagreement is excused, how many may be, and the argmax-agreement test.

A disagreement is two candidate tokens a, b at one position (ours vs stock on a forced path, our
speculative output vs stock's or vs our AR output at their first fork, or our speculative token vs
the referee's argmax past a fork). Its margin is the referee's |l[a] - l[b]|.

Referee rule: excused iff margin < max(REFEREE_K x noise, one ulp of the run dtype at the larger of the
two logits), where noise is the larger of stock's and our
worst path's RMS logit error against the referee over this run's forced positions. Why k = 4: a flip
between two tokens needs the difference of their two rounding errors to exceed the margin; if each
logit's error is ~noise and the two are independent, that difference has a spread of sqrt(2) x
noise, so k = 4 is ~2.8 of its sigmas: an honest rounding flip is excused with >99% probability,
and a real error larger than the run's own rounding is not. In an fp32 run (fp64 referee) the noise
is ~1e-6 of logits ~10: effectively exact.
The ulp floor: logits come out in the run dtype, and two tokens whose exact logits are less than one
ulp apart can round to the same value, which argmax then breaks by token index: no computation of
the run's dtype, however exact, orders them. The RMS noise, over the whole vocabulary, is mostly the
error of small logits and can sit below that. Measured need: the zoo hybrid pair in bf16, HumanEval/11
token 13: the referee puts 719 above 678 by 0.0589, both at 8.65 (bf16 ulp 0.0625); stock's bf16 logits
and ours are bitwise equal there, a tie that argmax gives to 678, in fp32 ours gives the referee's
margin to 1e-6; the noise rule alone (4 x 0.0113 = 0.045) failed the run.

A disagreement with the reference (a forced path, or our speculative output against stock's) where our
token is the referee's own choice is excused whatever its margin: the reference left the higher-precision
answer, ours did not, and a candidate can only earn that by computing the target more exactly. Our
speculative output against our own AR output gets no such excuse: either side wrong is ours. Measured need: on the zoo hybrid
pair in bf16 (H100) stock's greedy output left the fp32 referee's choice at a margin of 6.5x the
run's RMS noise, where our three forced paths kept it, and each counted as our mismatch.

Ulp fallback (no referee fits in memory, or --referee none): the scorer is stock's target at the
run's precision, and a disagreement is excused iff margin <= ULP_FALLBACK ulps of the run dtype at
the larger of the two logits (bf16 at logit 8.5: 2 x 0.0625; fp32: ~2e-6 at 10).

Precision: a path whose typical error against the referee (the median over positions of its error /
stock's error at the same position) exceeds PRECISION_FACTOR is not rounding differently but computing
less exactly: it fails. 2x is a lost bit. The median, not the ratio of RMS errors: in fp32 a few
sensitive positions rule the RMS (one position held 40% of stock's squared error on a tiny hybrid), so
the RMS ratio of two equally exact paths is noise; it put an honest hybrid path at 2.04-2.21x about
once in 30 runs, where its median ratio was near 1. Measured RMS ratios of honest paths: 0.45-2.04 (fp32,
tiny hybrid, 30 seeds), 0.74-1.00 (fp32 on the CPU, the zoo pair), 1.00-1.02 (bf16 on an H100, the zoo
pair and random 8B pairs).
Noise: the largest RMS error among stock and the precise paths, each path's counted at most
PRECISION_FACTOR x stock's, so that no path, however its errors are spread, widens the excuse rule by
more than a lost bit, and an imprecise one not at all (else a broken path would excuse its own
disagreements).

Cap: at most max(1, 1% of the generated tokens, (paths + 1) x stock's own flips) excused positions
(distinct contexts) per run, where stock's flips are the forced positions at which stock's argmax is not
the referee's: how often honest rounding breaks a near-tie on this model and these prompts, and paths is
the number of our forced paths. Where no rounding leaves the referee's argmax, all agree; so a position
is a disagreement only where at least one of the paths + 1 roundings (stock's and each path's: prefill,
decode and verify run different kernels, so they round independently) leaves it, which by the union bound
happens at most paths + 1 times as often as stock's one rounding does (each path leaving the referee no
more often than stock: the agreement test below). Our speculative and AR outputs are computed by the
verify and decode steps' kernels, so they add no rounding of their own at stock's positions. Measured
(CPU bf16, the zoo pair, 8 pystdlib prompts x 128 tokens): 5 stock flips, 9 excused positions, most of
them flipped by one path only. Without this term a model with many near-ties (random weights: flat
logits, stock itself leaves the fp32 argmax at ~7% of positions) fails every honest run; with it, an
engine that is excused more often than its honest roundings could be still fails.

Agreement: per forced path, our argmax must agree with the referee's at least as often as stock's
does. Tested on the positions where exactly one of the two agrees (a paired sign test, McNemar): the
path fails when it loses more of them than stock and a 50/50 split would give that many losses with
probability < AGREEMENT_ALPHA. A literal "count >= stock's count" would fail an honest bf16 run about
every other time two similar small counts of near-tie misses come out one apart; each of those
positions is in any case a disagreement judged by the margin rule and counted against the cap.
"""
from __future__ import annotations

import math

import torch

REFEREE_K = 4.0
ULP_FALLBACK = 2
EXCUSE_CAP_FRACTION = 0.01
AGREEMENT_ALPHA = 1e-3
PRECISION_FACTOR = 2.0
AGAINST_REFERENCE = ("forced", "spec-vs-stock")   # the checks whose other side is the reference's token


def excuse_cap(tokens: int, stock_flips: int = 0, paths: int = 1) -> int:
    """The most excused positions a run of `tokens` forced positions may have; stock_flips: the positions
    where stock's argmax is not the referee's (0 without a referee); paths: our forced paths, each its
    own rounding of every position."""
    if paths < 1:
        raise ValueError(f"excuse cap: paths={paths} must be >= 1")
    return max(1, int(EXCUSE_CAP_FRACTION * tokens), (paths + 1) * stock_flips)


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype` at |value| (its normal range)."""
    info = torch.finfo(dtype)
    return info.eps * 2.0 ** math.floor(math.log2(max(abs(value), info.tiny)))


class Rule:
    """referee "fp32" / "fp64" with the run's noise, or "none" (the ulp fallback in run_dtype)."""

    def __init__(self, referee: str, run_dtype: torch.dtype, noise: float | None = None):
        if referee != "none" and (noise is None or not math.isfinite(noise) or noise < 0):
            raise ValueError(f"the {referee} referee rule needs the run's measured noise, got {noise}")
        self.referee, self.run_dtype, self.noise = referee, run_dtype, noise

    def threshold(self, item: dict) -> float:
        if self.referee == "none":
            return ULP_FALLBACK * ulp(item["top"], self.run_dtype)
        return max(REFEREE_K * self.noise, ulp(item["top"], self.run_dtype))

    def excuses(self, item: dict) -> bool:
        return item["margin"] <= self.threshold(item) if self.referee == "none" else \
            item["margin"] < self.threshold(item) or self.sides_with_ours(item)

    def sides_with_ours(self, item: dict) -> bool:
        """Whether a referee (not the fallback scorer, stock's own model) chose our token over the
        reference's."""
        return self.referee != "none" and item.get("check") in AGAINST_REFERENCE \
            and item.get("referee_choice") is not None and item.get("ours") == item["referee_choice"]

    def describe(self) -> str:
        if self.referee == "none":
            return (f"ulp fallback (no referee): excused iff margin <= {ULP_FALLBACK} ulps of "
                    f"{str(self.run_dtype).replace('torch.', '')} at the larger logit, on stock's target")
        return (f"{self.referee} referee: excused iff margin < max({REFEREE_K:g} x noise {self.noise:.3g}, one "
                f"{str(self.run_dtype).replace('torch.', '')} ulp at the larger logit) or ours is the referee's choice")


def disagreement(scores: torch.Tensor, a: int, b: int, **fields) -> dict:
    """A record for tokens a, b at one position scored by the referee's (or fallback scorer's) logits
    [V]: margin |l[a] - l[b]|, the larger |logit| (for the ulp rule) and the scorer's own choice."""
    la, lb = float(scores[a]), float(scores[b])
    return {**fields, "margin": abs(la - lb), "top": max(abs(la), abs(lb)), "referee_choice": int(scores.argmax())}


def judge(items: list, rule: Rule) -> tuple:
    """Marks each item's threshold and excused flag; returns (excused, failed) lists."""
    excused, failed = [], []
    for item in items:
        item["threshold"] = rule.threshold(item)
        item["excused"] = item["margin"] != math.inf and rule.excuses(item)
        (excused if item["excused"] else failed).append(item)
    return excused, failed


def distinct_contexts(items: list) -> int:
    """Excused positions counted once per context (prompt, transcript, position): the three forced
    paths and a spec fork at one position of stock's transcript are one near-tie."""
    return len({(i["prompt"], i["context"], i["position"]) for i in items})


def noise_and_imprecise(error: dict) -> tuple:
    """error: side -> {rms_error, typical_ratio (our paths), ...} with side "stock" and our paths
    (ArbiterErrorTally.summary). -> (noise, {path: typical ratio to stock's error} for the paths beyond
    PRECISION_FACTOR)."""
    stock = error["stock"]["rms_error"]
    paths = {side: e for side, e in error.items() if side != "stock"}
    imprecise = {side: e["typical_ratio"] for side, e in paths.items() if e["typical_ratio"] > PRECISION_FACTOR}
    noise = max([stock] + [min(e["rms_error"], PRECISION_FACTOR * stock) for side, e in paths.items()
                           if side not in imprecise])
    return noise, imprecise


def sign_test_p(losses: int, wins: int) -> float:
    """One-sided P(X >= losses) for X ~ Binomial(losses + wins, 1/2)."""
    n = losses + wins
    return sum(math.comb(n, i) for i in range(losses, n + 1)) / 2 ** n if n else 1.0


class AgreementTally:
    """Per forced path, paired with stock at the same positions: whether each side's argmax is the
    referee's."""

    def __init__(self):
        self.counts = {}

    def add(self, path: str, ours: torch.Tensor, stock: torch.Tensor, referee: torch.Tensor) -> None:
        """argmax index tensors [T] of our path, of stock and of the referee."""
        ours_ok, stock_ok = ours.cpu() == referee.cpu(), stock.cpu() == referee.cpu()
        c = self.counts.setdefault(path, {"ours_agree": 0, "stock_agree": 0, "only_stock": 0, "only_ours": 0,
                                          "positions": 0})
        c["ours_agree"] += int(ours_ok.sum())
        c["stock_agree"] += int(stock_ok.sum())
        c["only_stock"] += int((stock_ok & ~ours_ok).sum())
        c["only_ours"] += int((ours_ok & ~stock_ok).sum())
        c["positions"] += int(ours_ok.numel())

    def stock_flips(self) -> int:
        """Positions where stock's argmax is not the referee's (every path sees the same positions)."""
        c = next(iter(self.counts.values()), None)
        return c["positions"] - c["stock_agree"] if c else 0

    def summary(self) -> dict:
        """path -> counts + p (sign test) + ok."""
        out = {}
        for path, c in self.counts.items():
            p = sign_test_p(c["only_stock"], c["only_ours"])
            ok = c["only_stock"] <= c["only_ours"] or p >= AGREEMENT_ALPHA
            out[path] = {**c, "p": p, "ok": ok}
        return out
