"""Engine knobs (first: the speculative block size), judged end to end.

A knob evaluator is evaluator(block_size) -> {"tokens_per_s": float, "forcing": ForcingOutcome};
a knob candidate passes only if token forcing with it passes, and its time is seconds per token.
`EngineKnobEvaluator` runs the engine on the zoo prompts; tests pass a fake.
"""


def evaluate_knob(cand, evaluator) -> dict:
    if evaluator is None:
        return {"verdicts": [{"check": "build", "passed": False, "reason": "no engine knob evaluator"}], "time_s": None}
    try:
        out = evaluator(int(cand.params["block_size"]))
    except Exception as e:
        return {"verdicts": [{"check": "crash", "passed": False, "reason": f"{type(e).__name__}: {e}"}], "time_s": None}
    forcing = out["forcing"]
    verdicts = [{"check": "token_forcing", "passed": bool(forcing.passed), "reason": forcing.reason}]
    if not forcing.passed:
        return {"verdicts": verdicts, "time_s": None}
    tps = float(out["tokens_per_s"])
    if not tps > 0:
        verdicts.append({"check": "timing", "passed": False, "reason": f"tokens/s {tps} is not positive"})
        return {"verdicts": verdicts, "time_s": None}
    return {"verdicts": verdicts, "time_s": 1.0 / tps, "timing_label": "engine-e2e"}


class EngineKnobEvaluator:
    """Token-forces the engine at a block size on the zoo prompts and times its spec decoding."""

    def __init__(self, target_dir, drafter_dir, device: str, n_prompts: int = 3, max_new_tokens: int = 64):
        import torch

        from specpilot.engine import Engine
        from specpilot.models import load_drafter, load_target
        from specpilot.verify.referee import load_referee
        from specpilot.verify.stock import load_stock

        dtype = torch.bfloat16  # split12 weights are bf16 by definition (the engine requires it)
        target = load_target(target_dir, device=device, dtype=dtype, weights="split12")
        self.engine = Engine(target, load_drafter(drafter_dir, target))
        self.stock = load_stock(target_dir, drafter_dir, device=device, dtype=dtype)
        self.referee = load_referee(target_dir, dtype, device)
        from specpilot.agents.forcing import _prompts

        self.prompts = _prompts(target_dir, n_prompts)
        self.max_new_tokens = max_new_tokens

    def __call__(self, block_size: int) -> dict:
        from specpilot.agents.forcing import ForcingOutcome
        from specpilot.verify.forcing import token_force

        report = token_force(self.engine, self.stock, self.prompts, self.max_new_tokens, block_size=block_size,
                             referee=self.referee)
        tokens = seconds = 0.0
        for p in self.prompts:
            r = self.engine.generate_spec(p, self.max_new_tokens, block_size=block_size)
            tokens += len(r.tokens)
            seconds += r.decode_s
        summary = {"prompts": report.prompts, "tokens": report.tokens, "mismatches": report.mismatches,
                   "spec_mismatches": report.spec_mismatches, "excused": report.excused, "reasons": report.reasons}
        return {"tokens_per_s": tokens / max(seconds, 1e-9),
                "forcing": ForcingOutcome(bool(report.passed), f"token forcing {summary}", summary)}
