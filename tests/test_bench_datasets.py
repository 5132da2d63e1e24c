"""bench/datasets.py: loading the prompt files, DFlash's seeded selection, rendering turns."""
import json
import os
import random
import string

import pytest

from specpilot import settings
from specpilot.bench import datasets


def _rand_text(rng, n=12):
    return "".join(rng.choice(string.ascii_letters + " \n") for _ in range(n)).strip() or "x"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def rng():
    """Fresh inputs every run; the seed is printed so a failure can be reproduced."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return random.Random(seed)


def test_load_benchmark_follows_dflash_selection(tmp_path, rng):
    n = rng.randint(20, 60)
    rows = [{"id": f"set/{i}", "turns": [_rand_text(rng)]} for i in range(n)]
    _write(tmp_path / "gsm8k.jsonl", rows)
    limit = rng.randint(1, n)
    got = datasets.load_benchmark(tmp_path, "gsm8k", limit)
    # dflash 0.1.0 _select_dataset: Random(42).shuffle(list(range(N))), first `limit`
    order = list(range(n))
    random.Random(42).shuffle(order)
    assert [s.id for s in got] == [rows[i]["id"] for i in order[:limit]]
    assert [s.turns for s in got] == [tuple(rows[i]["turns"]) for i in order[:limit]]
    assert len(datasets.load_benchmark(tmp_path, "gsm8k")) == n  # no limit: all rows, shuffled


def test_mtbench_two_turns_and_alias(tmp_path, rng):
    rows = [{"id": f"mtbench/{i}", "turns": [_rand_text(rng), _rand_text(rng)]} for i in range(5)]
    _write(tmp_path / "mtbench.jsonl", rows)
    got = datasets.load_benchmark(tmp_path, "mt-bench", 5)
    assert all(len(s.turns) == 2 for s in got)
    assert {s.turns for s in got} == {tuple(r["turns"]) for r in rows}


def test_zoo_prompt_rows_are_one_turn(tmp_path, rng):
    text = _rand_text(rng)
    _write(tmp_path / "humaneval.jsonl", [{"id": "HumanEval/0", "prompt": text}])
    (s,) = datasets.load_benchmark(tmp_path, "humaneval")
    assert s.turns == (text,)


@pytest.mark.parametrize("line, words", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"id": "x"}', "needs a 'turns' list"),
    ('{"id": "x", "turns": []}', "non-empty list"),
    ('{"id": "x", "turns": ["ok", 3]}', "non-empty list"),
])
def test_malformed_file_names_file_and_line(tmp_path, line, words):
    path = tmp_path / "mbpp.jsonl"
    path.write_text(json.dumps({"id": "a", "turns": ["fine"]}) + "\n\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"mbpp\.jsonl:3: .*{words}"):
        datasets.load_benchmark(tmp_path, "mbpp")


def test_missing_file_and_bad_limit(tmp_path):
    with pytest.raises(FileNotFoundError, match="math500.jsonl"):
        datasets.load_benchmark(tmp_path, "math500")
    _write(tmp_path / "math500.jsonl", [{"turns": ["q"]}])
    with pytest.raises(ValueError, match="limit must be >= 1"):
        datasets.load_benchmark(tmp_path, "math500", 0)


class _TemplateTokenizer:
    """Stands for an HF tokenizer: records the template call, encodes one id per character."""

    def __init__(self, template):
        self.chat_template, self.calls = template, []

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kw):
        self.calls.append((tokenize, add_generation_prompt, kw))
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"

    def encode(self, text, add_special_tokens=True):
        assert add_special_tokens is False  # DFlash encodes the rendered text without extra specials
        return [ord(c) for c in text]


def test_render_uses_template_with_thinking_off_else_raw(rng):
    msgs = [{"role": "user", "content": _rand_text(rng)}, {"role": "assistant", "content": _rand_text(rng)},
            {"role": "user", "content": _rand_text(rng)}]
    qwen = _TemplateTokenizer("{% if enable_thinking %}...{% endif %}")
    assert datasets.render(qwen, msgs).endswith("|assistant:")
    assert qwen.calls == [(False, True, {"enable_thinking": False})]
    plain = _TemplateTokenizer("{{ messages }}")
    datasets.render(plain, msgs)
    assert plain.calls == [(False, True, {})]
    base = _TemplateTokenizer(None)
    assert datasets.render(base, msgs) == "".join(m["content"] for m in msgs)
    assert datasets.encode(base, msgs) == [ord(c) for c in datasets.render(base, msgs)]


def test_shipped_datasets_match_readme_selection():
    folder = settings.get().datasets
    if not (folder / "gsm8k.jsonl").exists():
        pytest.skip(f"datasets folder {folder} not present")
    # shared/datasets/README.md: first shuffled indices gsm8k [588, 1214, 57, ...]; mt-bench [49, 63, 23]
    rows = datasets.read_jsonl(folder / "gsm8k.jsonl")
    got = datasets.load_benchmark(folder, "gsm8k", 3)
    assert [s.id for s in got] == [rows[i].id for i in (588, 1214, 57)]
    mt = datasets.load_benchmark(folder, "mtbench", 3)
    assert all(len(s.turns) == 2 for s in mt)
