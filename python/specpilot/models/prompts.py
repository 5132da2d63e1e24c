"""Prompt files and prompt encoding.

Rows are JSONL `{"id", "turns": [user message, ...]}` (the benchmark datasets) or `{"id", "prompt"}`
(the zoo prompt sets). Rows with `turns` go through the tokenizer's chat template when it has one
(one user message per turn, generation prompt added); everything else is encoded raw with
`add_special_tokens=False` (the zoo model is a base code model).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Prompt:
    id: str
    text: str | None = None        # raw prompt
    turns: list | None = None      # chat turns (user messages)


def read_prompts(path, limit: int | None = None) -> list[Prompt]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    prompts = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno} is not valid JSON: {e}") from None
        if not isinstance(row, dict) or not ("prompt" in row or "turns" in row):
            raise ValueError(f"{path}:{lineno}: a row needs 'prompt' (text) or 'turns' (list of messages)")
        turns = row.get("turns")
        if turns is not None and (not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns)):
            raise ValueError(f"{path}:{lineno}: 'turns' must be a non-empty list of strings")
        prompts.append(Prompt(id=str(row.get("id", lineno)), text=row.get("prompt"), turns=turns))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise ValueError(f"prompt file {path} has no prompts")
    return prompts


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt (first turn only for multi-turn rows: one generation per prompt)."""
    if prompt.turns is not None and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt.turns[0]}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    text = prompt.text if prompt.text is not None else prompt.turns[0]
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
