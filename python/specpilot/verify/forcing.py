"""Token forcing and the verdict of `specpilot verify` (the reward-hacking guard).

For each prompt: run stock (dflash_generate on HF) and keep its transcript. Teacher-force prompt +
transcript through OUR target three times and compare our argmax at every generated position with
stock's token: in one forward pass over the whole sequence (path "prefill": the multi-token kernels
of prefill), through the engine's one-token decode step, token by token after a prefill of the
prompt (path "decode": the AR step's kernels and CUDA graphs), and through the engine's B-token
verify step, stock's tokens fed a block at a time (path "verify": the speculative loop's verify
kernels and graphs). Then judge what users get: our speculative output against stock's and against
our own AR output, and past a fork our speculative transcript against the referee (spec_checks.py).

Every disagreement is scored by the referee (referee.py: the target at a higher precision) and
excused only under verdict.py's rule (margin below k x the run's measured noise, capped in number);
the referee also scores every forced position of stock and of each of our paths (arbiter_error.py:
RMS logit error, which is the noise; verdict.AgreementTally: how often each argmax is the referee's).
passed = no unexcused forced-path mismatch, no unexcused speculative-output disagreement, excused
positions within the cap, every path's referee agreement not worse than stock's and its typical error
within verdict.PRECISION_FACTOR of stock's, and (fp32 runs) stock's acceptance lengths wherever our
output is stock's.
For a hybrid recurrent target the transcript forced against is the target's own greedy AR instead of
stock's (target_greedy.py: stock is not lossless there); the rules are the same, and acceptance lengths
are not compared (AR has none).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from specpilot.engine.cache import target_cache
from specpilot.engine.engine import drafter_kind
from specpilot.progress import progress

from .arbiter_error import ArbiterErrorTally
from .referee import Referee, load_referee, scored_logits
from .spec_checks import spec_disagreements
from .stock import StockPair, hf_logits, run_stock
from .target_greedy import STOCK, reference_for, run_target_greedy, runs_stock_pair
from .verdict import (PRECISION_FACTOR, REFEREE_K, AgreementTally, Rule, disagreement, distinct_contexts, excuse_cap,
                      judge, noise_and_imprecise)

PATHS = ("prefill", "decode", "verify")


@dataclass
class ForcingReport:
    prompts: int = 0
    tokens: int = 0                         # stock's generated tokens (each forced on every path)
    mismatches: int = 0                     # unexcused forced-path disagreements
    spec_mismatches: int = 0                # unexcused disagreements of our speculative output
    excused: int = 0                        # excused positions (distinct contexts)
    excuse_cap: int = 0
    passed: bool = False
    reasons: list = field(default_factory=list)           # why it failed, one line each
    reference: str = STOCK                  # the transcript forced against (target_greedy.reference_for)
    referee: str = ""                       # "fp32", "fp64" or "none" (the ulp fallback)
    referee_note: str = ""
    referee_k: float = REFEREE_K
    noise: float | None = None              # max RMS logit error vs the referee (stock, our paths)
    rule: str = ""
    spec_identical: int = 0                 # prompts where our spec output == stock's
    ar_identical: int = 0                   # prompts where our spec output == our AR output
    acceptance_mismatches: int = 0          # prompts with stock's output but not its acceptance lengths
    acceptance_judged: bool = False         # fp32 runs: those fail (see _decide)
    agreement: dict = field(default_factory=dict)         # path -> argmax agreement with the referee vs stock's
    referee_error: dict = field(default_factory=dict)     # side -> {rms_error, same_argmax, positions}
    excused_list: list = field(default_factory=list)      # every record: prompt, check, position, tokens, margin
    mismatch_list: list = field(default_factory=list)
    spec_mismatch_list: list = field(default_factory=list)
    per_prompt: list = field(default_factory=list)

    def summary(self) -> dict:
        """The JSON line: counts, the rule, the verdict and every excused / failed record."""
        keys = ("reference", "prompts", "tokens", "mismatches", "spec_mismatches", "excused", "excuse_cap", "passed", "reasons",
                "referee", "referee_k", "noise", "rule", "referee_note", "spec_identical", "ar_identical",
                "acceptance_mismatches", "acceptance_judged", "agreement", "referee_error", "excused_list",
                "mismatch_list", "spec_mismatch_list")
        return {k: _json_safe(getattr(self, k)) for k in keys}

    def to_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def forced_logits(target, sequence) -> torch.Tensor:
    """Our target's logits [L, V] at every position of one full sequence (one forward, fresh cache)."""
    ids = torch.tensor([list(map(int, sequence))], dtype=torch.long, device=target.device)
    length = ids.shape[1]
    target.ensure_rope(length + 1)
    cache = target_cache(target, 1, length)
    positions = torch.arange(length, device=target.device)
    logits, _ = target(ids, positions, cache, length)           # [1, L, V]
    return logits[0]


def _prefill_logits(engine, prompt):
    """(runner, device, [our logits for the first new token]) after a prefill of the prompt into the
    engine's cache."""
    runner, device = engine.runner, engine.target.device
    logits, _ = runner.prefill(torch.tensor([list(map(int, prompt))], device=device), with_features=False)
    return runner, device, [logits[0, -1].clone()]


@torch.inference_mode()
def forced_decode_logits(engine, prompt, tokens) -> torch.Tensor:
    """Our logits [T, V] for each of `tokens` through the engine's AR path: prefill the prompt, then
    one one-token decode step (graphed on CUDA) per token, fed stock's token, not our choice."""
    runner, device, rows = _prefill_logits(engine, prompt)
    for j, token in enumerate(tokens[:-1]):
        logits, _ = runner.target_step(torch.tensor([[int(token)]], device=device), len(prompt) + j,
                                       with_features=False)
        rows.append(logits[0, -1].clone())                    # a graph's output buffer is reused
    return torch.stack(rows)


@torch.inference_mode()
def forced_verify_logits(engine, prompt, tokens, block_size: int) -> torch.Tensor:
    """Our logits [T, V] for each of `tokens` through the engine's verify step: prefill the prompt,
    then stock's tokens block_size at a time (graphed on CUDA; a short last block eagerly, as in
    the speculative loop), each row's logits choosing the next token."""
    runner, device, rows = _prefill_logits(engine, prompt)
    fed = list(map(int, tokens[:-1]))
    for start in range(0, len(fed), block_size):
        block = fed[start:start + block_size]
        logits, _ = runner.target_step(torch.tensor([block], device=device), len(prompt) + start,
                                       with_features=False, graphed=len(block) == block_size)
        rows.extend(logits[0].clone())
    return torch.stack(rows)


def token_force(engine, stock: StockPair, prompts, max_new_tokens: int, stop_ids=(), block_size=None,
                ids=None, spec_results=None, ar_results=None, referee: Referee | None = None) -> ForcingReport:
    """prompts: list of token-id lists. Greedy only (token forcing compares argmax choices).
    spec_results / ar_results: our generate_spec / generate_ar results for the same prompts and
    settings, if already run. referee: referee.load_referee(...) (None: loaded here from the target's
    folder, placed automatically)."""
    target = engine.target
    if referee is None:
        referee = load_referee(target.source_dir, target.dtype, str(target.device.type))
    tally, agreement = ArbiterErrorTally(), AgreementTally()
    forced_items, spec_items, rows = [], [], []
    report = ForcingReport(reference=reference_for(target, drafter_kind(engine.drafter)), referee=referee.kind,
                           referee_note=referee.note)
    run_reference = run_stock if runs_stock_pair(report.reference) else run_target_greedy
    verify_block = block_size or (engine.drafter.block_size if engine.drafter is not None else 1)
    for index, prompt in enumerate(progress(prompts, desc="stock runs + token forcing", unit="prompt")):
        name = ids[index] if ids is not None else index
        prompt = list(map(int, prompt))
        ref = run_reference(stock, prompt, max_new_tokens, stop_ids, 0.0, block_size)
        sequence, n, t = prompt + ref.tokens, len(prompt), len(ref.tokens)
        generated = slice(n - 1, len(sequence) - 1)                  # the positions that chose stock's tokens
        with engine.runner.kernel_ctx(len(sequence)):   # the linears' prefill kernels (split12: "dense")
            prefill = forced_logits(target, sequence)[generated]
        logits = {"prefill": prefill,                                  # [T, V] each: our logits per stock token
                  "decode": forced_decode_logits(engine, prompt, ref.tokens),
                  "verify": forced_verify_logits(engine, prompt, ref.tokens, verify_block)}
        stock_logits = hf_logits(stock, sequence)[generated]
        if referee.model is not None:
            score = lambda tokens: scored_logits(referee.model, prompt + tokens, len(tokens))  # noqa: E731
            scores = score(ref.tokens)                                 # [T, V] the referee at stock's positions
        else:                      # the ulp fallback scores with stock's own model: its logits are in hand
            score = lambda tokens: hf_logits(stock, prompt + tokens)[n - 1:n - 1 + len(tokens)].cpu()  # noqa: E731
            scores = stock_logits.cpu()
        if referee.model is not None:
            tally.add("stock", stock_logits, scores)
            for path, rows_ in logits.items():
                tally.add(path, rows_, scores)
                agreement.add(path, rows_.argmax(-1), stock_logits.argmax(-1), scores.argmax(-1))
        for path, rows_ in logits.items():
            for j, mine in enumerate(rows_.argmax(-1).tolist()):
                if mine != ref.tokens[j]:
                    item = disagreement(scores[j], mine, ref.tokens[j], prompt=name, check="forced", path=path,
                                        position=j, context="stock", ours=mine, other=ref.tokens[j])
                    if referee.model is not None:   # stock's own RMS logit error here: is this position's noise the run's?
                        item["stock_local_error"] = float(tally.last_position_errors("stock")[j])
                    forced_items.append(item)
        del logits
        spec = spec_results[index] if spec_results is not None else \
            engine.generate_spec(prompt, max_new_tokens, stop_ids=stop_ids, block_size=block_size)
        ar = ar_results[index] if ar_results is not None else engine.generate_ar(prompt, max_new_tokens, stop_ids)
        spec_scores = (lambda: scores) if spec.tokens == ref.tokens else (lambda: score(spec.tokens))
        items, fork_stock, fork_ar = spec_disagreements(name, ref.tokens, spec.tokens, ar.tokens, spec_scores)
        spec_items.extend(items)
        rows.append({"id": name, "prompt_len": n, "tokens": t, "spec_tokens": len(spec.tokens),
                     "spec_identical": fork_stock is None, "ar_identical": fork_ar is None,
                     "spec_fork": fork_stock, "ar_fork": fork_ar,
                     "acceptance_identical": spec.acceptance_lengths == ref.acceptance_lengths,
                     "stock_tau": _mean(ref.acceptance_lengths), "our_tau": spec.tau, "stock_s": ref.seconds,
                     "our_decode_tokens_per_s": spec.tokens_per_s})
        report.tokens += t
    report.prompts = len(rows)
    _decide(report, target.dtype, tally, agreement, forced_items, spec_items, rows,
            drafts_are_stocks=engine.config.draft_vocab == 0 and engine.config.tree_budget == 0)
    return report


def _decide(report: ForcingReport, run_dtype, tally, agreement, forced_items, spec_items, rows,
            drafts_are_stocks: bool = True) -> None:
    """The noise, the rule, every record judged, the cap, the agreement test: report.passed and why not."""
    report.referee_error = tally.summary()
    imprecise = {}
    if report.referee != "none":
        report.noise, imprecise = noise_and_imprecise(report.referee_error)
    rule = Rule(report.referee, run_dtype, report.noise)
    report.rule = rule.describe()
    forced_ok, report.mismatch_list = judge(forced_items, rule)
    spec_ok, report.spec_mismatch_list = judge(spec_items, rule)
    report.excused_list = forced_ok + spec_ok
    report.mismatches, report.spec_mismatches = len(report.mismatch_list), len(report.spec_mismatch_list)
    report.excused = distinct_contexts(report.excused_list)
    report.excuse_cap = excuse_cap(report.tokens, agreement.stock_flips(), paths=len(PATHS))
    report.agreement = agreement.summary()
    for row in rows:
        mine = lambda items: [i for i in items if i["prompt"] == row["id"]]  # noqa: E731
        row.update(mismatches=len(mine(report.mismatch_list)), spec_mismatches=len(mine(report.spec_mismatch_list)),
                   excused=distinct_contexts(mine(report.excused_list)))
    report.per_prompt = rows
    report.spec_identical = sum(r["spec_identical"] for r in rows)
    report.ar_identical = sum(r["ar_identical"] for r in rows)
    # Same output, so the same verify inputs: in fp32 our drafter and stock's agree to ~1e-6, so the
    # accepted counts are step for step stock's (a stale draft context, say, changes them, not the
    # output). In bf16 / fp16 the drafter's own near-ties may differ: reported, not judged.
    report.acceptance_mismatches = sum(r["spec_identical"] and not r["acceptance_identical"] for r in rows) \
        if runs_stock_pair(report.reference) else 0
    # The target's greedy AR (hybrid targets) has no acceptance; a reduced draft vocabulary
    # (EngineConfig.draft_vocab) changes the drafts, tree verification (tree_budget) the steps, by
    # design: none of these is judged.
    report.acceptance_judged = run_dtype == torch.float32 and runs_stock_pair(report.reference) and drafts_are_stocks
    reasons = []
    if report.acceptance_judged and report.acceptance_mismatches:
        reasons.append(f"{report.acceptance_mismatches} prompts with stock's output but other acceptance lengths "
                       "(fp32: must be stock's step for step)")
    if report.mismatches:
        reasons.append(f"{report.mismatches} forced-path mismatches beyond the rule")
    if report.spec_mismatches:
        reasons.append(f"{report.spec_mismatches} disagreements of our speculative output beyond the rule")
    if report.excused > report.excuse_cap:
        reasons.append(f"{report.excused} excused positions exceed the cap of {report.excuse_cap}")
    for path, a in report.agreement.items():
        if not a["ok"]:
            reasons.append(f"{path} path agrees with the referee less often than stock ({a['ours_agree']} vs "
                           f"{a['stock_agree']} of {a['positions']}; sign test p={a['p']:.2g})")
    for path, ratio in imprecise.items():
        reasons.append(f"{path} path's logit error against the referee is typically {ratio:.3g}x stock's "
                       f"(median over positions > {PRECISION_FACTOR:g}x: lost precision, not rounding)")
    if not report.prompts:
        reasons.append("no prompts were verified")
    report.reasons, report.passed = reasons, not reasons


def _json_safe(value):
    """An infinite margin (a length difference: no excuse possible) as None, so the line is strict JSON."""
    if isinstance(value, float) and value == float("inf"):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def _mean(xs) -> float:
    return sum(xs) / len(xs) if xs else 0.0
