"""The benchmark prompt sets: loading, DFlash's seeded selection, and turning turns into token ids.

File format (see shared/datasets/README.md): UTF-8 JSONL, one object per line, either
`{"id", "turns": [user1, user2?], "source"}` (the five DFlash sets, templates already applied)
or `{"id", "prompt"}` (the zoo's raw prompt files), read as one turn.
"""
import json
import random
from dataclasses import dataclass
from pathlib import Path

# The five DFlash benchmarks, in DFlash's order. File name = `<name>.jsonl`.
BENCHMARKS = ("gsm8k", "math500", "humaneval", "mbpp", "mtbench")
ALIASES = {"mt-bench": "mtbench", "mt_bench": "mtbench"}
SELECTION_SEED = 42  # dflash.benchmark._select_dataset: random.Random(42).shuffle(range(N))


@dataclass(frozen=True)
class Sample:
    id: str
    turns: tuple[str, ...]  # user messages; a second turn is asked after the model's first answer


def canonical_name(name: str) -> str:
    return ALIASES.get(name.strip().lower(), name.strip().lower())


def dataset_path(folder: Path, name: str) -> Path:
    return Path(folder) / f"{canonical_name(name)}.jsonl"


def _parse_row(path: Path, lineno: int, line: str) -> Sample:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
    if "turns" in row:
        turns = row["turns"]
    elif "prompt" in row:
        turns = [row["prompt"]]
    else:
        raise ValueError(f"{path}:{lineno}: needs a 'turns' list or a 'prompt' string; keys are {sorted(row)}")
    if (not isinstance(turns, list) or not turns
            or not all(isinstance(t, str) and t for t in turns)):
        raise ValueError(f"{path}:{lineno}: 'turns' must be a non-empty list of non-empty strings, got {turns!r:.120}")
    return Sample(id=str(row.get("id", f"{path.stem}/{lineno - 1}")), turns=tuple(turns))


def read_jsonl(path: Path) -> list[Sample]:
    """Every row of one prompt file, in file order. Errors name the file and the 1-based line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    samples = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                samples.append(_parse_row(path, lineno, line))
    if not samples:
        raise ValueError(f"{path}: no rows")
    return samples


def dflash_order(n: int) -> list[int]:
    """Row indices in DFlash's shuffled order (dflash 0.1.0 `_select_dataset`, no repeat)."""
    order = list(range(n))
    random.Random(SELECTION_SEED).shuffle(order)
    return order


def load_benchmark(folder: Path, name: str, limit: int | None = None) -> list[Sample]:
    """The first `limit` rows (all if None) of `<folder>/<name>.jsonl` in DFlash's seeded order."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    rows = read_jsonl(dataset_path(folder, name))
    order = dflash_order(len(rows))
    return [rows[i] for i in order[: len(order) if limit is None else limit]]


# ---- prompts -> token ids ------------------------------------------------------------------------

def render(tokenizer, messages: list[dict]) -> str:
    """The text the target sees: its chat template when it has one (generation prompt on, thinking
    off when the template knows the flag, as DFlash's Qwen3 drafters were trained), else the raw
    message contents concatenated (a base model, e.g. the zoo's code LM)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return "".join(m["content"] for m in messages)
    kwargs = {"enable_thinking": False} if "enable_thinking" in str(template) else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def encode(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the rendered conversation, no extra special tokens (as DFlash encodes)."""
    ids = tokenizer.encode(render(tokenizer, messages), add_special_tokens=False)
    if not ids:
        raise ValueError(f"conversation {messages!r:.120} encodes to no tokens")
    return list(ids)
