"""One method's output on one prompt (`MethodRun`) and the JSONL row it becomes.

Timing convention (dflash 0.1.0 `dflash_generate(return_stats=True)`, which the report mirrors):
prefill_s = prompt forward up to the first new token; decode_s = everything after it; time per
output token = decode_s / number of new tokens (the first token, made by the prefill, counts).
"""
from dataclasses import dataclass


@dataclass
class MethodRun:
    tokens: list[int]                      # new tokens only, stop token included
    prefill_s: float
    decode_s: float
    acceptance_lengths: list[int] | None = None  # tokens per verify step, bonus included (spec methods)
    replay_shortfalls: int | None = None  # replay only: steps the target did not accept as planned

    @property
    def time_per_token(self) -> float | None:
        return self.decode_s / len(self.tokens) if self.tokens else None


def make_row(benchmark: str, sample_id: str, turn: int, index: int, method: str,
             prompt_len: int, run: MethodRun) -> dict:
    """The JSONL row for one prompt x method (all numbers the report needs, plus the tokens)."""
    tpot = run.time_per_token
    return {
        "benchmark": benchmark, "sample_id": sample_id, "turn": turn, "prompt_index": index,
        "method": method, "prompt_len": prompt_len, "new_tokens": len(run.tokens),
        "prefill_s": run.prefill_s, "decode_s": run.decode_s,
        "time_per_token_s": tpot, "tokens_per_s": (1.0 / tpot) if tpot else None,
        "acceptance_lengths": run.acceptance_lengths,
        "steps": len(run.acceptance_lengths) if run.acceptance_lengths is not None else None,
        "replay_shortfalls": run.replay_shortfalls,
        "tokens": list(run.tokens),
    }
