"""Token forcing: the reward-hacking guard.

For each prompt: run stock (dflash_generate on HF), keep its transcript, teacher-force prompt +
transcript through OUR target three times and compare our argmax at every generated position with
stock's token: once in one forward pass over the whole sequence (path "prefill": the multi-token
kernels of prefill), once through the engine's own one-token decode step, token by token after a
prefill of the prompt (path "decode": the AR step's kernels and CUDA graphs, e.g. gemv_fusion), and
once through the engine's B-token verify step, stock's tokens fed a block at a time after a prefill
of the prompt (path "verify": the kernels and graphs of the speculative loop's verify pass, e.g.
the 2..16-row skinny GEMM, which a long one-forward pass does not use).
A mismatch is tolerated only where stock's own top-2 logit margin at that
position (HF forward over the same sequence) is below eps: a bf16 near-tie that either side may break
either way. eps = 0 in fp32 (no tolerance), eps = 1e-2 * max(1, |top logit|) in bf16/fp16 (about one
bf16 ulp of the logit). Every tolerated mismatch is listed with its margin. Separately, our own
speculative decoding output is compared with stock's tokens (identical-prefix length).

Arbiter (optional, diagnostic only: it never changes the verdict): the same target in fp32 scores
each position where ours and stock disagree, telling which side the exact-er arithmetic takes
(a bf16 engine that is merely rounded differently sides with fp32 about as often as stock does),
and every generated position of stock and of each of our paths (arbiter_error.py: RMS logit error
against fp32, and how often the argmax is fp32's).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from specpilot.engine.cache import KVCache

from .arbiter_error import ArbiterErrorTally
from .stock import StockPair, hf_logits, run_stock

BF16_REL_EPS = 1e-2


@dataclass
class ForcingReport:
    prompts: int = 0
    tokens: int = 0                         # positions compared (each on every path)
    mismatches: int = 0                     # untolerated: each one fails the run
    tolerated: int = 0                      # near-tie mismatches (details in tolerated_list)
    passed: bool = True
    eps_rule: str = ""
    tolerated_list: list = field(default_factory=list)   # {prompt, path, position, ours, stock, margin, eps}
    mismatch_list: list = field(default_factory=list)
    spec_identical: int = 0                 # prompts where our spec output == stock's tokens
    per_prompt: list = field(default_factory=list)
    arbiter: str = ""                       # "" or the arbiter's dtype; then, over all disagreements:
    arbiter_sides_with_ours: int = 0        # the arbiter's argmax is our token
    arbiter_sides_with_stock: int = 0       # the arbiter's argmax is stock's token
    arbiter_error: dict = field(default_factory=dict)    # side -> {rms_error, same_argmax, positions}: every position

    def summary(self) -> dict:
        keys = ("prompts", "tokens", "mismatches", "tolerated", "passed", "spec_identical", "eps_rule")
        out = {k: getattr(self, k) for k in keys}
        if self.arbiter:
            out.update(arbiter=self.arbiter, arbiter_sides_with_ours=self.arbiter_sides_with_ours,
                       arbiter_sides_with_stock=self.arbiter_sides_with_stock, arbiter_error=self.arbiter_error)
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def eps_for(dtype: torch.dtype, top_logit: float) -> float:
    if dtype == torch.float32:
        return 0.0
    return BF16_REL_EPS * max(1.0, abs(top_logit))


@torch.inference_mode()
def forced_logits(target, sequence) -> torch.Tensor:
    """Our target's logits [L, V] at every position of one full sequence (one forward, fresh cache)."""
    c = target.config
    ids = torch.tensor([list(map(int, sequence))], dtype=torch.long, device=target.device)
    length = ids.shape[1]
    target.ensure_rope(length + 1)
    cache = KVCache(c.num_layers, 1, c.num_kv_heads, length, c.head_dim, target.device, target.dtype)
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


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def token_force(engine, stock: StockPair, prompts, max_new_tokens: int, stop_ids=(), block_size=None,
                ids=None, spec_results=None, arbiter=None) -> ForcingReport:
    """prompts: list of token-id lists. Greedy only (token forcing compares argmax choices).
    spec_results: our generate_spec results for the same prompts and settings, if already run.
    arbiter: the same target at higher precision (e.g. loaded in fp32), or None (see module doc)."""
    target = engine.target
    dtype = target.dtype
    report = ForcingReport(eps_rule="eps=0 (fp32)" if dtype == torch.float32 else
                           f"eps={BF16_REL_EPS}*max(1,|top logit|) ({str(dtype).replace('torch.', '')})",
                           arbiter=str(arbiter.dtype).replace("torch.", "") if arbiter is not None else "")
    tally = ArbiterErrorTally()
    for index, prompt in enumerate(prompts):
        name = ids[index] if ids is not None else index
        ref = run_stock(stock, prompt, max_new_tokens, stop_ids, 0.0, block_size)
        sequence = list(prompt) + ref.tokens
        n = len(prompt)
        verify_block = block_size or (engine.drafter.block_size if engine.drafter is not None else 1)
        generated = slice(n - 1, len(sequence) - 1)                  # the positions that chose stock's tokens
        with engine.runner.kernel_ctx(len(sequence)):   # the linears' prefill kernels (split12: "dense")
            prefill = forced_logits(target, sequence)[generated]
        logits = {"prefill": prefill,                                  # [T, V] each: our logits per stock token
                  "decode": forced_decode_logits(engine, prompt, ref.tokens),
                  "verify": forced_verify_logits(engine, prompt, ref.tokens, verify_block)}
        paths = {path: rows.argmax(-1).tolist() for path, rows in logits.items()}
        stock_logits = arbiter_logits = None
        if arbiter is not None:                                        # scores every position, not only ties
            arbiter_logits = forced_logits(arbiter, sequence)[generated].float()
            stock_logits = hf_logits(stock, sequence)
            tally.add("stock", stock_logits[generated], arbiter_logits)
            for path, rows in logits.items():
                tally.add(path, rows, arbiter_logits)
        del logits
        row = {"id": name, "prompt_len": n, "tokens": len(ref.tokens), "mismatches": 0, "tolerated": 0}
        disagreements = [(path, j, mine, theirs) for path, ours in paths.items()
                         for j, (mine, theirs) in enumerate(zip(ours, ref.tokens)) if mine != theirs]
        for path, j, mine, theirs in disagreements:
            if stock_logits is None:
                stock_logits = hf_logits(stock, sequence)
            top2 = stock_logits[n - 1 + j].topk(2).values.tolist()
            margin, eps = top2[0] - top2[1], eps_for(dtype, top2[0])
            item = {"prompt": name, "path": path, "position": j, "ours": mine, "stock": theirs, "margin": margin,
                    "eps": eps}
            if arbiter is not None:
                _arbitrate(report, item, arbiter_logits[j])
            if margin < eps:
                report.tolerated_list.append(item)
                row["tolerated"] += 1
            else:
                report.mismatch_list.append(item)
                row["mismatches"] += 1
        spec = spec_results[index] if spec_results is not None else \
            engine.generate_spec(prompt, max_new_tokens, stop_ids=stop_ids, block_size=block_size)
        row.update(spec_identical_prefix=_common_prefix(spec.tokens, ref.tokens), spec_tokens=len(spec.tokens),
                   spec_identical=spec.tokens == ref.tokens, stock_tau=_mean(ref.acceptance_lengths),
                   our_tau=spec.tau, stock_s=ref.seconds, our_decode_tokens_per_s=spec.tokens_per_s)
        report.spec_identical += row["spec_identical"]
        report.prompts += 1
        report.tokens += len(ref.tokens)
        report.mismatches += row["mismatches"]
        report.tolerated += row["tolerated"]
        report.per_prompt.append(row)
    report.passed = report.mismatches == 0
    report.arbiter_error = tally.summary()
    return report


def _arbitrate(report: ForcingReport, item: dict, logits: torch.Tensor) -> None:
    """Notes on `item` the arbiter's choice and its logit(ours) - logit(stock); counts its side."""
    choice = int(logits.argmax())
    item.update(arbiter_choice=choice, arbiter_ours_minus_stock=float(logits[item["ours"]] - logits[item["stock"]]))
    report.arbiter_sides_with_ours += choice == item["ours"]
    report.arbiter_sides_with_stock += choice == item["stock"]


def _mean(xs) -> float:
    return sum(xs) / len(xs) if xs else 0.0
