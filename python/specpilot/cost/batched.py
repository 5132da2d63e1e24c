"""The batched step model: AR and speculative steps at concurrency C with every component at its
ceiling (gaps.ceiling_of: max(bytes / bandwidth, flops / matmul rate, one launch) per op), so it needs
no device and no checkpoint, only shapes and a card's ceilings.

A step at C requests reads each weight once per forward (its linears run over all C x rows rows), each
request's KV (attention), and its GEMM flops grow with the total rows: flat while the weights' bytes
bind, linear in the rows past the ridge. The verify rows per step are an input:
  full block      C x block rows, tokens = C x E[a]
  verify_len L    C x L rows (anchor + L-1 drafts), tokens = C x E[min(a, L)] (acceptance cut at L-1 drafts)
  verify_prefix P prefix-first (BatchConfig.verify_prefix, engine/batch/prefix_first.py): pass 1 over
                  C x P rows, pass 2 over block - P rows for the k requests that accepted all P drafts
                  (a >= P + 1): a second weight pass whenever k > 0. k is Binomial(C, q), q = P(a >= P+1);
                  the expected pass-2 time sums over k. Tokens as the full block (same decisions).
                  The engine takes P < block; P = block (no pass 2) is accepted here as the limit.
a: a step's acceptance length (tokens committed, bonus included, 1..block), from a recorded trace or a
stated tau with a geometric model (the per-position acceptance alpha with sum_{i<block} alpha^i = tau).
The graphed engine pads a forward's requests to the next request bucket (engine/batch/graphed.py);
`graphed=True` times the padded rows, as the engine runs them. Attention of both prefix-first passes
is timed at the stated context (the prefix's P extra keys are left out).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specpilot.cost.ceilings import Ceilings
from specpilot.cost.gaps import ceiling_of, work
from specpilot.cost.shapes import step_components

# Stated ceilings of the cards (docs/design.md: measured copy bandwidth H200 4.17 TB/s, H100 3.03 TB/s;
# dense bf16 nominal rate; the 1.04 us graph launch floor of docs/design.md section 3's timings).
CARDS = {"H100": Ceilings("cuda", "H100 (stated)", 3.03e12, 9.89e14, 1.04e-6, "bfloat16"),
         "H200": Ceilings("cuda", "H200 (stated)", 4.17e12, 9.89e14, 1.04e-6, "bfloat16")}


def geometric_alpha(tau: float, block: int) -> float:
    """The per-position acceptance alpha with (1 - alpha^block) / (1 - alpha) = tau (bisection)."""
    if block < 1 or not 1.0 <= tau <= block:
        raise ValueError(f"tau {tau} must lie in [1, {block}] (block {block})")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a ** i for i in range(block)) < tau else (lo, a)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Acceptance:
    """The law of a step's acceptance length a (tokens committed, bonus included): pmf[i] = P(a = i + 1)."""
    pmf: tuple
    source: str

    def __post_init__(self):
        if not self.pmf or any(p < 0 for p in self.pmf) or abs(sum(self.pmf) - 1.0) > 1e-9:
            raise ValueError(f"Acceptance.pmf must be a non-empty probability vector, got {self.pmf}")

    @property
    def block(self) -> int:
        return len(self.pmf)

    @staticmethod
    def from_lengths(lengths, block: int, source: str = "trace") -> "Acceptance":
        """From recorded per-step acceptance lengths (each in 1..block)."""
        lengths = list(lengths)
        bad = [a for a in lengths if not (isinstance(a, int) and 1 <= a <= block)]
        if not lengths or bad:
            raise ValueError(f"acceptance lengths must be ints in 1..{block}, non-empty; bad: {bad[:5]}")
        return Acceptance(tuple(lengths.count(a) / len(lengths) for a in range(1, block + 1)),
                          f"{source} ({len(lengths)} steps)")

    @staticmethod
    def geometric(tau: float, block: int, tau_block: int | None = None) -> "Acceptance":
        """P(a >= k) = alpha^(k-1) for k in 1..block, alpha fitted so that E[a] = tau at tau_block (default
        block): a tau stated at the drafter's block gives the law at a shorter block too."""
        alpha = geometric_alpha(tau, tau_block or block)
        surv = [alpha ** (k - 1) for k in range(1, block + 1)] + [0.0]
        return Acceptance(tuple(surv[i] - surv[i + 1] for i in range(block)),
                          f"geometric, tau {tau:g} at block {tau_block or block} (alpha {alpha:.4f})")

    def survival(self, k: int) -> float:
        """P(a >= k)."""
        return sum(self.pmf[max(0, k - 1):])

    def mean(self, cap: int | None = None) -> float:
        """E[min(a, cap)] (cap None: E[a])."""
        cap = cap or self.block
        return sum(p * min(i + 1, cap) for i, p in enumerate(self.pmf))


def padded_requests(n: int, graphed: bool) -> int:
    """Requests a forward over n requests runs: the graphed engine's request bucket, else n."""
    if not graphed or n == 0:
        return n
    from specpilot.engine.batch.graphed import request_bucket

    return request_bucket(n)


def step_seconds(target, drafter, feats: int, batch: int, rows: int, ceil: Ceilings, weights: str = "bf16",
                 context: int = 1024, draft_vocab: int = 0, certified=None, prefill_rows: int = 0) -> dict:
    """{step: {kind: seconds}} for decode (batch x 1 rows), draft and verify (batch x rows rows), every
    component at its ceiling (the rule of cost/gaps.py and two_level.step_ceilings); prefill_rows: a
    prompt chunk riding in the decode and verify forwards (shapes.step_components)."""
    out = {}
    for c in step_components(target, drafter, feats, batch, rows, context, weights, draft_vocab, certified,
                             prefill_rows):
        nbytes, flops = work(c, ceil.device, target, drafter, batch, context, weights)
        seconds = c.extra[0] * ceil.launch_s if c.kind == "launches" else ceiling_of(nbytes, flops, ceil)[0]
        kinds = out.setdefault(c.step, {})
        kinds[c.kind] = kinds.get(c.kind, 0.0) + seconds * c.count
    return out


def binomial_expectation(n: int, q: float, seconds_of) -> float:
    """E[seconds_of(k)] for k ~ Binomial(n, q), seconds_of(0) taken as 0 (no pass runs)."""
    return sum(math.comb(n, k) * q ** k * (1 - q) ** (n - k) * seconds_of(k) for k in range(1, n + 1))


def batched_step(target, drafter, feats: int, concurrency: int, acceptance: Acceptance, ceil: Ceilings,
                 weights: str = "bf16", context: int = 1024, verify_prefix: int = 0, verify_len: int = 0,
                 graphed: bool = True, prefill_rows: int = 0) -> dict:
    """The AR step and the speculative step (draft + verify under one verify policy) at concurrency C,
    tokens per step from `acceptance` (its block is the drafter's block: the drafter drafts it whole),
    tokens/s of each and spec over AR. Times in seconds; breakdown: {step: {kind: seconds}}.
    prefill_rows: both steps carry a newcomer's chunk of that many prompt rows (in prefix-first, its
    first pass does)."""
    block, c = acceptance.block, concurrency
    if c < 1 or block < 2:
        raise ValueError(f"need concurrency >= 1 and block >= 2, got {c}, {block}")
    if verify_prefix and verify_len:
        raise ValueError("give verify_prefix (prefix-first) or verify_len (a shorter verify), not both")
    if verify_prefix and not 1 <= verify_prefix <= block:
        raise ValueError(f"verify_prefix {verify_prefix} must be in 1..{block} (the engine takes 1..{block - 1}; "
                         f"P = block is one pass over the block, the model's limit)")
    if verify_len and not 1 <= verify_len <= block:
        raise ValueError(f"verify_len {verify_len} must be in 1..{block}")
    r = padded_requests(c, graphed)

    def steps(requests, rows, chunk=prefill_rows):
        return step_seconds(target, drafter, feats, requests, rows, ceil, weights, context, prefill_rows=chunk)

    spec = steps(r, block)
    decode = spec["decode"]
    breakdown = {"decode": decode, "draft": spec["draft"]}
    pass2, q = 0.0, 0.0
    if verify_prefix:
        rest = block - verify_prefix
        breakdown["verify"] = steps(r, verify_prefix)["verify"]
        q = acceptance.survival(verify_prefix + 1)          # accepted all P judged drafts
        by_k = {k: steps(padded_requests(k, graphed), rest, 0)["verify"] for k in range(1, c + 1)} if q > 0 else {}
        pass2_kinds = {kind: binomial_expectation(c, q, lambda k: by_k[k][kind]) if q > 0 else 0.0
                       for kind in breakdown["verify"]}
        breakdown["verify.pass2"] = pass2_kinds
        pass2 = sum(pass2_kinds.values())
        rows = c * verify_prefix + c * q * rest
        tokens = c * acceptance.mean()
        policy = f"prefix-first P={verify_prefix}"
    else:
        length = verify_len or block
        breakdown["verify"] = spec["verify"] if length == block else steps(r, length)["verify"]
        rows, tokens = c * length, c * acceptance.mean(length)
        policy = "full block" if length == block else f"verify length L={length}"
    total = {k: sum(v.values()) for k, v in breakdown.items()}
    spec_s = total["draft"] + total["verify"] + pass2
    ar_tps, spec_tps = c / total["decode"], tokens / spec_s
    return {"concurrency": c, "padded_requests": r, "block": block, "policy": policy,
            "acceptance": acceptance.source, "tau": acceptance.mean(), "tokens_per_step": tokens,
            "verify_rows": rows, "full_rows": c * block, "pass2_request_share": q,
            "pass2_step_share": 1 - (1 - q) ** c if verify_prefix else 0.0,
            "decode_s": total["decode"], "draft_s": total["draft"], "verify_s": total["verify"] + pass2,
            "pass1_s": total["verify"] if verify_prefix else None, "pass2_s": pass2 if verify_prefix else None,
            "spec_s": spec_s, "ar_tokens_per_s": ar_tps, "spec_tokens_per_s": spec_tps,
            "speedup_over_ar": spec_tps / ar_tps, "breakdown": breakdown,
            "ceilings": ceil.to_dict(), "weights": weights, "context": context, "graphed": graphed,
            "prefill_rows": prefill_rows}


def closed_loop(target, drafter, feats: int, concurrency: int, acceptance: Acceptance, ceil: Ceilings,
                new_tokens: int, prompt_tokens: float, prefill_chunk: int = 256, mixed_verify_len: int | None = None,
                **kw) -> dict:
    """A closed loop's speedup at the ceilings: C clients, each request `prompt_tokens` prompt rows and
    `new_tokens` new tokens. Prefill costs AR and spec alike in rows, but not in share: each chunk step
    (at most `prefill_chunk` prompt rows, riding in a decode forward: batched_step's prefill_rows) is
    one of AR's new_tokens steps a request and a spec step that makes its own tokens. Per C requests:
    C * prompt_tokens / prefill_chunk chunk steps, each also a decode step; past the decode steps a run
    is prefill-bound. Full occupancy (no waves or tails). mixed_verify_len: the chunk steps' verify
    length (adaptive verify prices a chunk step with its chunk; default: kw's verify_len).
    kw: batched_step's."""
    if new_tokens < 1 or prompt_tokens < 0 or prefill_chunk < 1:
        raise ValueError(f"need new_tokens >= 1, prompt_tokens >= 0, prefill_chunk >= 1, got "
                         f"{new_tokens}, {prompt_tokens}, {prefill_chunk}")
    plain = batched_step(target, drafter, feats, concurrency, acceptance, ceil, **kw)
    if mixed_verify_len is not None:
        kw = dict(kw, verify_len=mixed_verify_len)
    mixed = batched_step(target, drafter, feats, concurrency, acceptance, ceil, prefill_rows=prefill_chunk, **kw)
    chunk_steps = concurrency * prompt_tokens / prefill_chunk
    ar_s, _ = closed_loop_seconds(concurrency * new_tokens, chunk_steps, (plain["decode_s"], concurrency),
                                  (mixed["decode_s"], concurrency))
    spec_s, spec_steps = closed_loop_seconds(concurrency * new_tokens, chunk_steps,
                                             (plain["spec_s"], plain["tokens_per_step"]),
                                             (mixed["spec_s"], mixed["tokens_per_step"]))
    return {"concurrency": concurrency, "new_tokens": new_tokens, "prompt_tokens": prompt_tokens,
            "prefill_chunk": prefill_chunk, "chunk_steps": chunk_steps, "ar_steps": new_tokens,
            "spec_steps": spec_steps, "ar_s": ar_s, "spec_s": spec_s, "speedup_over_ar": ar_s / spec_s,
            "decode_only_speedup": plain["speedup_over_ar"],
            "mixed_ms": {"ar": mixed["decode_s"] * 1e3, "spec": mixed["spec_s"] * 1e3},
            "plain_ms": {"ar": plain["decode_s"] * 1e3, "spec": plain["spec_s"] * 1e3},
            "spec_prefill_share": chunk_steps * mixed["spec_s"] / spec_s, "policy": plain["policy"]}


def closed_loop_seconds(tokens: float, chunk_steps: float, plain: tuple, mixed: tuple) -> tuple:
    """(seconds, steps) to make `tokens` new tokens when `chunk_steps` of the steps also carry a prompt
    chunk; plain / mixed: (seconds, tokens) of a step without / with a chunk. The chunk steps make
    their own tokens, decode steps the rest; a prefill-bound run (the chunk steps alone make every
    token) still runs all its chunk steps."""
    (plain_s, plain_tokens), (mixed_s, mixed_tokens) = plain, mixed
    left = tokens - chunk_steps * mixed_tokens
    steps = chunk_steps + left / plain_tokens if left > 0 else tokens / mixed_tokens
    return chunk_steps * mixed_s + max(0.0, steps - chunk_steps) * plain_s, steps


def format_closed_loop(loop: dict) -> str:
    return (f"# closed loop at the ceilings: {loop['prompt_tokens']:.0f} prompt + {loop['new_tokens']} new tokens a "
            f"request, chunks of {loop['prefill_chunk']} rows ({loop['chunk_steps']:.1f} chunk steps per "
            f"{loop['concurrency']} requests)\n"
            f"step ms without / with a chunk: AR {loop['plain_ms']['ar']:.3f} / {loop['mixed_ms']['ar']:.3f}, spec "
            f"{loop['plain_ms']['spec']:.3f} / {loop['mixed_ms']['spec']:.3f}; chunk steps "
            f"{100 * loop['spec_prefill_share']:.0f}% of spec's time\n"
            f"closed-loop spec / AR {loop['speedup_over_ar']:.2f}x (decode steps alone "
            f"{loop['decode_only_speedup']:.2f}x)")


def best_verify_len(target, drafter, feats, concurrency, acceptance, ceil, **kw) -> dict:
    """The verify length L in 1..block with the most tokens/s (the full block wins ties)."""
    runs = [batched_step(target, drafter, feats, concurrency, acceptance, ceil, verify_len=n, **kw)
            for n in range(acceptance.block, 0, -1)]
    return max(runs, key=lambda s: s["spec_tokens_per_s"])


def format_step(s: dict) -> str:
    """The step breakdown and the speedup over batched AR, one block of text."""
    ms = 1e3
    lines = [f"# batched step model at the ceilings ({s['ceilings']['device_name']}: "
             f"{s['ceilings']['copy_bandwidth'] / 1e12:.2f} TB/s, {s['ceilings']['matmul_flops'] / 1e12:.0f} TFLOP/s, "
             f"launch {s['ceilings']['launch_s'] * 1e6:.2f} us), {s['weights']}, context {s['context']}",
             f"# concurrency {s['concurrency']} (forwards padded to {s['padded_requests']} requests), block "
             f"{s['block']}, {s['policy']}; acceptance: {s['acceptance']}, E[a] {s['tau']:.3f}",
             f"{'step':<14} {'ms':>8}   by kind (ms)"]
    for step, kinds in s["breakdown"].items():
        label = "verify.pass1" if step == "verify" and s["pass1_s"] is not None else step
        detail = ", ".join(f"{k} {v * ms:.3f}" for k, v in kinds.items())
        lines.append(f"{label:<14} {sum(kinds.values()) * ms:>8.3f}   {detail}")
    lines.append(f"verified rows per step {s['verify_rows']:.1f} of {s['full_rows']} drafted; tokens per step "
                 f"{s['tokens_per_step']:.2f}")
    if s["pass2_s"] is not None:
        lines.append(f"pass 2: {100 * s['pass2_request_share']:.1f}% of requests, {100 * s['pass2_step_share']:.1f}% "
                     f"of steps; expected {s['pass2_s'] * ms:.3f} ms per step")
    lines.append(f"spec step {s['spec_s'] * ms:.3f} ms -> {s['spec_tokens_per_s']:.0f} tok/s; batched AR "
                 f"{s['decode_s'] * ms:.3f} ms -> {s['ar_tokens_per_s']:.0f} tok/s; spec / AR {s['speedup_over_ar']:.2f}x")
    return "\n".join(lines)
