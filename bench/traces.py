"""Acceptance traces for the scale tier: how many tokens each verify step produces when replayed.

A trace is a list of per-prompt sequences of acceptance lengths (bonus token included, values in
1..block_size), recorded from a real run (the zoo pair) or synthesised from a fixed tau. The replayed
engine forces exactly trace[i] tokens at step i, so the report must say which trace it used:
`Trace.describe()`.

JSON file (written by `save`, read by `load`):
  {"format": "specpilot.acceptance_trace/1", "source": "...", "block_size": 16,
   "prompts": [{"benchmark": "humaneval", "id": "HumanEval/61", "acceptance_lengths": [3, 1, 5]}, ...]}
`load` also takes a bare list of ints or of lists of ints.
"""
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "specpilot.acceptance_trace/1"


@dataclass
class Trace:
    source: str  # what it was recorded from, or "fixed tau X"
    block_size: int
    prompts: list[dict] = field(default_factory=list)  # {"benchmark", "id", "acceptance_lengths"}

    @property
    def tau(self) -> float:
        """Mean over prompts of the mean acceptance length (dflash's 'Average Acceptance length')."""
        seqs = [p["acceptance_lengths"] for p in self.prompts if p["acceptance_lengths"]]
        return statistics.mean(statistics.mean(s) for s in seqs) if seqs else float("nan")

    def describe(self) -> str:
        return f"{self.source} (block {self.block_size}, {len(self.prompts)} prompt(s), tau {self.tau:.2f})"

    def steps_for(self, prompt_index: int, min_tokens: int) -> list[int]:
        """The acceptance lengths to replay on prompt `prompt_index`: that prompt's sequence (cycling
        over the recorded prompts), repeated until it covers at least `min_tokens` tokens."""
        seqs = [p["acceptance_lengths"] for p in self.prompts if p["acceptance_lengths"]]
        if not seqs:
            raise ValueError(f"trace {self.source!r} holds no acceptance lengths")
        seq = seqs[prompt_index % len(seqs)]
        reps = max(1, math.ceil(min_tokens / sum(seq)))
        return list(seq) * reps


def fixed_tau(tau: float, block_size: int, n_steps: int = 4096) -> Trace:
    """A deterministic sequence of floor(tau)/ceil(tau) values whose mean over any prefix stays
    within 1/len of tau (step i produces floor((i+1)*tau) - floor(i*tau) tokens)."""
    if not 1.0 <= tau <= block_size:
        raise ValueError(f"tau must be in [1, block_size={block_size}], got {tau}")
    seq = [math.floor((i + 1) * tau) - math.floor(i * tau) for i in range(n_steps)]
    return Trace(source=f"fixed tau {tau:g}", block_size=block_size,
                 prompts=[{"benchmark": None, "id": None, "acceptance_lengths": seq}])


def _check(path, prompts, block_size):
    for i, p in enumerate(prompts):
        bad = [a for a in p["acceptance_lengths"] if not (isinstance(a, int) and 1 <= a <= block_size)]
        if bad:
            raise ValueError(f"{path}: prompt {i}: acceptance lengths must be ints in 1..{block_size}, "
                             f"got {bad[:5]}")


def load(path: Path, block_size: int | None = None) -> Trace:
    """Read a trace file; `block_size` (the run's) must not be smaller than the trace's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"acceptance trace {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if isinstance(data, list):  # bare list: one sequence, or one per prompt
        seqs = data if data and isinstance(data[0], list) else [data]
        prompts = [{"benchmark": None, "id": None, "acceptance_lengths": s} for s in seqs]
        trace_bs = max((max(s) for s in seqs if s), default=1)
        trace = Trace(source=str(path), block_size=block_size or trace_bs, prompts=prompts)
    elif isinstance(data, dict) and data.get("format") == FORMAT:
        trace = Trace(source=f"{path} ({data.get('source', 'unknown source')})",
                      block_size=int(data["block_size"]), prompts=list(data["prompts"]))
    else:
        raise ValueError(f"{path}: expected format {FORMAT!r} or a list of ints")
    _check(path, trace.prompts, trace.block_size)
    if block_size is not None and block_size < trace.block_size:
        raise ValueError(f"{path}: trace has block size {trace.block_size}, larger than the run's {block_size}")
    return trace


def save(trace: Trace, path: Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"format": FORMAT, "source": trace.source, "block_size": trace.block_size,
                                "prompts": trace.prompts}) + "\n")
    return path


def from_rows(rows: list[dict], method: str, source: str, block_size: int) -> Trace:
    """A trace recorded from a benchmark run: one entry per row of `method` with acceptance lengths."""
    prompts = [{"benchmark": r["benchmark"], "id": f'{r["sample_id"]}#{r["turn"]}',
                "acceptance_lengths": list(r["acceptance_lengths"])}
               for r in rows if r["method"] == method and r.get("acceptance_lengths")]
    return Trace(source=source, block_size=block_size, prompts=prompts)


def parse_replay(value: str, block_size: int) -> Trace:
    """`--replay` argument: a number (fixed tau) or a path to a trace JSON."""
    try:
        tau = float(value)
    except ValueError:
        return load(Path(value), block_size)
    return fixed_tau(tau, block_size)
