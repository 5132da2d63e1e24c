"""Why did the acceptance part where the outputs did not? The drafter's logits of both sides at the first
differing step (bench/tau_parity --probe).

With identical outputs and identical earlier steps, a step whose acceptance differs must have drafted
differently (the same drafts against the same accepted tokens accept the same count), so the question is
whether the two drafters' argmaxes part on a near-tie (a top-2 margin inside the two sides' logit noise)
or by a real margin. Both sides are rerun on the prompt, recording every draft call: stock through its
drafter's `compute_logits`, ours through the stepwise loop's `runner.draft_step` (the fused step drafts
inside one graph, so the probe first checks that the stepwise loop reproduces the acceptance it reports).
"""
from __future__ import annotations

import math

import torch


def _recorded_stock(stock, prompt_ids, max_new_tokens, stop_ids, block_size):
    from specpilot.verify.stock import run_stock

    calls, drafter = [], stock.drafter
    plain = drafter.compute_logits

    def recording(hidden, head):
        logits = plain(hidden, head)
        calls.append(logits[0].float().cpu())
        return logits
    drafter.compute_logits = recording
    try:
        result = run_stock(stock, prompt_ids, max_new_tokens, stop_ids, 0.0, block_size)
    finally:
        del drafter.compute_logits                              # back to the class's method
    return result, calls


def _recorded_ours(stepwise_engine, prompt_ids, max_new_tokens, stop_ids, block_size):
    calls, runner = [], stepwise_engine.runner
    plain = runner.draft_step

    def recording(*args, **kwargs):
        logits = plain(*args, **kwargs)
        calls.append(logits[0].float().cpu())
        return logits
    runner.draft_step = recording
    try:
        result = stepwise_engine.generate_spec(prompt_ids, max_new_tokens, stop_ids=stop_ids, block_size=block_size)
    finally:
        del runner.draft_step
    return result, calls


def _top2(row: torch.Tensor) -> dict:
    """The argmax (first index of a tie, as torch.argmax and both loops choose) and the runner-up."""
    first = int(row.argmax())
    rest = row.clone()
    rest[first] = -math.inf
    second = int(rest.argmax())
    values = [float(row[first]), float(row[second])]
    return {"ids": [first, second], "logits": [round(v, 5) for v in values], "margin": round(values[0] - values[1], 5)}


def compare_drafts(stock_logits: torch.Tensor, our_logits: torch.Tensor) -> dict:
    """[T, V] draft logits of one step on both sides -> the first row whose argmax differs, each side's
    top 2 there, each side's gap between its own choice and the other's, and the logit noise
    (max |stock - ours| over that row)."""
    if stock_logits.shape != our_logits.shape:
        raise ValueError(f"draft logits of different shapes: stock {tuple(stock_logits.shape)}, "
                         f"ours {tuple(our_logits.shape)}")
    s_arg, o_arg = stock_logits.argmax(-1), our_logits.argmax(-1)
    differing = (s_arg != o_arg).nonzero().flatten().tolist()
    diff = (stock_logits - our_logits).abs()
    out = {"draft_rows": stock_logits.shape[0], "differing_rows": len(differing),
           "max_abs_logit_diff": round(float(diff.max()), 5), "median_abs_logit_diff": round(float(diff.median()), 6)}
    if not differing:
        return {**out, "row": None}
    r = differing[0]
    s, o, a, b = stock_logits[r], our_logits[r], int(s_arg[r]), int(o_arg[r])
    ulp = bf16_ulp(float(s[a]))
    return {**out, "row": r, "stock_top2": _top2(s), "our_top2": _top2(o),
            "stock_gap": round(float(s[a] - s[b]), 5), "our_gap": round(float(o[b] - o[a]), 5),
            "bf16_ulp": ulp, "stock_gap_ulps": round(float(s[a] - s[b]) / ulp, 2),
            "choices_noise": round(max(abs(float(s[a] - o[a])), abs(float(s[b] - o[b]))), 5)}


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at |x| (8 significand bits)."""
    return 2.0 ** (math.frexp(abs(x) or 1.0)[1] - 8)


def step_of_token(acceptance: list, token) -> int | None:
    """The step that produced new token `token` (token 0 is the prefill's: step -1), None for None."""
    if token is None or token == 0:
        return None if token is None else -1
    produced = 1
    for step, n in enumerate(acceptance):
        produced += n
        if token < produced:
            return step
    return len(acceptance)                          # past stock's end: ours went on


def probe(engine, stock, prompt_ids, max_new_tokens, stop_ids, block_size, row) -> dict:
    """For a tau_parity row with identical outputs and different acceptance: the drafters at the first
    differing step. `engine` is the run's engine; the probe drafts stepwise on a twin of it."""
    import dataclasses

    from specpilot.engine import Engine

    step = row["first_step_difference"]
    parted = step_of_token(row["stock_acceptance"], row["first_token_difference"])
    if parted is not None and parted < step:        # the drafts at `step` saw different contexts: no probe
        return {"step": step, "outputs_parted_at_step": parted}
    twin = Engine(engine.target, engine.drafter, max_seq_len=engine.max_seq_len,
                  config=dataclasses.replace(engine.config, fused_steps=False))
    ref, stock_calls = _recorded_stock(stock, prompt_ids, max_new_tokens, stop_ids, block_size)
    ours, our_calls = _recorded_ours(twin, prompt_ids, max_new_tokens, stop_ids, block_size)
    out = {"step": step, "stock_reproduced": list(ref.acceptance_lengths) == row["stock_acceptance"],
           "stepwise_reproduced": list(ours.acceptance_lengths) == row["our_acceptance"]}
    if not (out["stock_reproduced"] and out["stepwise_reproduced"]):
        return out                                  # the reruns are not the runs measured: nothing to compare
    return {**out, **compare_drafts(stock_calls[step], our_calls[step])}


def probe_section(rows: list) -> str:
    """report.md's --probe section: the drafters at the first step whose acceptance differs."""
    done = [r for r in rows if "draft_probe" in r]
    if not done:
        return ""
    cols = ["set", "id", "outputs", "step", "draft row", "differing rows", "stock top 2 (ids: logits)",
            "our top 2 (ids: logits)", "stock margin (bf16 ulps)", "logit change of the two tokens",
            "median logit diff"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in done:
        p = r["draft_probe"]
        cells = [r["set"], r["id"], "identical" if r["identical"] else "different", p["step"]]
        if "outputs_parted_at_step" in p:
            cells.append(f"the outputs parted first, at step {p['outputs_parted_at_step']}")
        elif "row" not in p:
            cells.append("the reruns did not reproduce the run")
        elif p["row"] is None:
            cells.append("the drafts agree: the target's side parted (its verify or the accept rule)")
        else:
            def top(t):
                return f"{t['ids'][0]}, {t['ids'][1]}: {t['logits'][0]:.4f}, {t['logits'][1]:.4f}"
            cells += [p["row"], f"{p['differing_rows']} / {p['draft_rows']}", top(p["stock_top2"]),
                      top(p["our_top2"]), f"{p['stock_gap']:.4f} ({p['stock_gap_ulps']})",
                      f"{p['choices_noise']:.4f}", f"{p['median_abs_logit_diff']:.5f}"]
        cells += [""] * (len(cols) - len(cells))
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n## Drafters at the first step whose acceptance differs\n\n" + "\n".join(lines) + "\n"
