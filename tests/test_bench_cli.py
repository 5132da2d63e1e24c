"""`specpilot bench` end to end on a tiny random pair (CPU, fp32), and the e2e loop with fakes."""
import json
import os
import pathlib
import random
import string
import tempfile

import pytest

from specpilot import cli
from specpilot.bench import e2e, metrics, traces
from specpilot.bench.datasets import Sample
from specpilot.bench.rows import MethodRun


@pytest.fixture
def rng():
    """Fresh inputs every run; the seed is printed so a failure can be reproduced."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return random.Random(seed)


def _text(rng, n):
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(n)) + "."


@pytest.fixture
def tiny_pair(tmp_path, rng):
    from specpilot.models.random_ckpt import write_pair

    return write_pair(tmp_path / "pair", "tiny-qwen3", block_size=4, seed=rng.randrange(2**31))


@pytest.fixture
def prompt_dir(tmp_path, rng):
    folder = tmp_path / "datasets"
    folder.mkdir()
    (folder / "gsm8k.jsonl").write_text("".join(
        json.dumps({"id": f"gsm8k/{i}", "turns": [_text(rng, 20)]}) + "\n" for i in range(3)))
    (folder / "mtbench.jsonl").write_text("".join(
        json.dumps({"id": f"mtbench/{i}", "turns": [_text(rng, 15), _text(rng, 10)]}) + "\n" for i in range(2)))
    return folder


def _rows(out):
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def test_cli_all_methods(tiny_pair, prompt_dir, tmp_path, capsys):
    target, drafter = tiny_pair
    out = tmp_path / "out"
    rc = cli.main(["bench", "--target", str(target), "--drafter", str(drafter), "--datasets", str(prompt_dir),
                   "--benchmarks", "gsm8k,mt-bench", "--limit", "1", "--max-new-tokens", "9", "--dtype", "fp32",
                   "--device", "cpu", "--methods", ",".join(e2e.METHODS), "--tier", "correctness", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    rows = _rows(out)
    keys = {(r["benchmark"], r["turn"], r["method"]) for r in rows}
    assert keys == {(b, t, m) for b, turns in (("gsm8k", 1), ("mtbench", 2))
                    for t in range(turns) for m in e2e.METHODS}
    for r in rows:
        assert 1 <= r["new_tokens"] <= 9 and r["decode_s"] >= 0 and r["prefill_s"] > 0
        if r["method"] in ("stock", "our_spec"):
            assert sum(r["acceptance_lengths"]) == r["new_tokens"] - 1  # the first token is the prefill's
            assert all(1 <= a <= 4 for a in r["acceptance_lengths"])
    # every method sees the same second-turn prompt: first turn + an answer + the second user turn
    mt = [r for r in rows if r["benchmark"] == "mtbench"]
    assert len({r["prompt_len"] for r in mt if r["turn"] == 1}) == 1
    turn0 = next(r for r in mt if r["turn"] == 0)
    turn1 = next(r for r in mt if r["turn"] == 1)
    assert turn1["prompt_len"] > turn0["prompt_len"] + 10
    # printed last: the markdown tables (throughput, speedups, identical outputs) from these rows
    table = captured.out.strip().splitlines()
    summary = metrics.summarize(rows, 4)
    throughput, _, agreement = (t for t in table if t.startswith("| gsm8k |"))
    same, n = summary["gsm8k"]["agreement"]["our_spec/stock"]
    assert f"{same}/{n}" in agreement and f'{summary["gsm8k"]["methods"]["stock"]["tau"]:.2f}' in throughput
    assert table[-1].startswith("| all |")
    md = (out / "report.md").read_text()
    assert "Fidelity tier: correctness" in md and "fp32" in md
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert traces.load(out / "traces_stock.json").prompts  # replayable trace recorded
    assert "[gsm8k 1/1]" in captured.err and "tok/s" in captured.err


def test_cli_split12_folder_target(tmp_path, prompt_dir, rng, capsys):
    """A packed (split12) target: our methods run split12 weights, stock reads a bf16 unpack of the
    folder; the report names the weights."""
    import torch

    from specpilot.models.random_ckpt import write_pair

    target, drafter = write_pair(tmp_path / "pair", "tiny-qwen3", block_size=4, seed=rng.randrange(2**31),
                                 dtype=torch.bfloat16)
    assert cli.main(["pack", str(target), str(tmp_path / "packed")]) == 0
    unpacks = lambda: set(pathlib.Path(tempfile.gettempdir()).glob("specpilot-bf16-*"))  # noqa: E731
    before = unpacks()
    out = tmp_path / "out"
    rc = cli.main(["bench", "--target", str(tmp_path / "packed"), "--drafter", str(drafter), "--datasets",
                   str(prompt_dir), "--benchmarks", "gsm8k", "--limit", "1", "--max-new-tokens", "6", "--dtype", "bf16",
                   "--device", "cpu", "--methods", "stock,our_ar,our_spec", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert {r["method"] for r in _rows(out)} == {"stock", "our_ar", "our_spec"}
    assert json.loads((out / "run_info.json").read_text())["weights"] == "split12"
    assert unpacks() <= before  # the temporary bf16 unpack for stock is gone


def test_cli_times_two_weight_formats_in_one_run(tmp_path, prompt_dir, rng, capsys):
    """--weights bf16,split12: one engine per format, rows named by format, every format against the
    same HF baseline and split12 against bf16; bad lists are refused before anything loads."""
    import torch

    from specpilot.models.random_ckpt import write_pair

    target, drafter = write_pair(tmp_path / "pair", "tiny-qwen3", block_size=4, seed=rng.randrange(2**31),
                                 dtype=torch.bfloat16)
    out = tmp_path / "out"
    rc = cli.main(["bench", "--target", str(target), "--drafter", str(drafter), "--datasets", str(prompt_dir),
                   "--benchmarks", "gsm8k,mtbench", "--limit", "1", "--max-new-tokens", "6", "--dtype", "bf16",
                   "--device", "cpu", "--methods", "hf_static,our_ar,our_spec", "--weights", "bf16,split12",
                   "--replay", "2", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = _rows(out)
    methods = ["hf_static", "our_ar@bf16", "our_ar@split12", "our_spec@bf16", "our_spec@split12"]
    assert [r["method"] for r in rows if r["benchmark"] == "gsm8k"] == methods
    assert len({r["prompt_len"] for r in rows if r["turn"] == 1}) == 1  # one second-turn prompt for all
    summary = metrics.summarize(rows, 4)["all"]
    assert {"our_spec@split12/hf_static", "our_spec@bf16/hf_static", "our_ar@split12/our_ar@bf16",
            "our_spec@split12/our_spec@bf16"} <= summary["speedups"].keys()
    md = (out / "report.md").read_text()
    assert "our weight format: bf16,split12" in md and "our spec (split12) / our spec (bf16)" in md
    for bad, why in (("bf16,int4", "use bf16, split12 or a comma list"), ("split12,split12", "names a format twice")):
        rc = cli.main(["bench", "--target", str(target), "--drafter", str(drafter), "--datasets", str(prompt_dir),
                       "--weights", bad, "--dtype", "bf16", "--out", str(tmp_path / "o")])
        assert rc == 2 and why in capsys.readouterr().err


def test_cli_replay_follows_trace(tiny_pair, prompt_dir, tmp_path, rng, capsys):
    target, drafter = tiny_pair
    out = tmp_path / "out"
    tau = round(rng.uniform(1.5, 3.5), 2)
    rc = cli.main(["bench", "--target", str(target), "--drafter", str(drafter), "--datasets", str(prompt_dir),
                   "--benchmarks", "gsm8k", "--limit", "2", "--max-new-tokens", "17", "--dtype", "fp32",
                   "--methods", "our_ar,our_spec", "--replay", str(tau), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    want = traces.fixed_tau(tau, 4).prompts[0]["acceptance_lengths"]
    for r in (r for r in _rows(out) if r["method"] == "our_spec"):
        acc = r["acceptance_lengths"]
        assert acc[:-1] == want[:len(acc) - 1]  # the last step may be cut by the stop token or the length cap
        assert sum(acc) == r["new_tokens"] - 1 and r["replay_shortfalls"] is not None
    md = (out / "report.md").read_text()
    assert "Fidelity tier: scale" in md and f"fixed tau {tau:g}" in md


def test_cli_bad_input_is_one_line_error(tiny_pair, prompt_dir, tmp_path, capsys):
    target, drafter = tiny_pair
    rc = cli.main(["bench", "--target", str(target), "--drafter", str(drafter), "--datasets", str(prompt_dir),
                   "--benchmarks", "humaneval", "--out", str(tmp_path / "o")])
    assert rc == 2 and "humaneval.jsonl does not exist" in capsys.readouterr().err
    rc = cli.main(["bench", "--target", str(target), "--datasets", str(prompt_dir), "--methods", "our_spec,fast"])
    assert rc == 2 and "unknown method(s) ['fast']" in capsys.readouterr().err
    rc = cli.main(["bench", "--target", str(target), "--datasets", str(prompt_dir), "--methods", "stock"])
    assert rc == 2 and "need --drafter" in capsys.readouterr().err


class _CharTokenizer:
    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


class _PaddingTokenizer(_CharTokenizer):
    """Char-level, except that ids >= 1000 decode to three characters, as a random target's
    padding and broken byte pieces decode to text that re-encodes to many more tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("xyz" if i >= 1000 else chr(i) for i in ids)


def test_carried_answer_is_cut_to_the_room_the_caches_have(rng, capsys):
    n = rng.randint(3, 40)
    short = [ord(c) for c in _text(rng, rng.randint(1, 2 * n - 1))]
    assert e2e.carried_answer(_PaddingTokenizer(), short, n) == "".join(map(chr, short))
    assert capsys.readouterr().err == ""
    padded = [1000] * n  # decodes to 3n characters: 3n tokens against a room of 2n
    cut = e2e.carried_answer(_PaddingTokenizer(), padded, n, "mtbench q1")
    assert cut == ("xyz" * n)[:e2e.ANSWER_ROOM * n]
    assert f"mtbench q1: the answer re-encodes to {3 * n} tokens, cut to {2 * n}" in capsys.readouterr().err


def test_seq_len_bound_has_room_for_the_last_answer_and_each_carried_one(rng):
    from specpilot.commands.bench import _seq_len_bound

    one, two = Sample("g/1", (_text(rng, 30),)), Sample("m/1", (_text(rng, 10), _text(rng, 10)))
    n, block = rng.randint(1, 500), rng.randint(2, 16)
    bound = lambda samples, n: _seq_len_bound(_CharTokenizer(), {"b": samples}, n, block)  # noqa: E731
    assert bound([one], n + 1) - bound([one], n) == 1                      # the last turn's answer
    assert bound([two], n + 1) - bound([two], n) == 1 + e2e.ANSWER_ROOM    # plus the carried one
    assert bound([one, two], n) == max(bound([one], n), bound([two], n))


def test_cli_keeps_the_rows_measured_before_an_error(tiny_pair, prompt_dir, tmp_path, monkeypatch, capsys):
    """A run that fails at MT-Bench's second turn still writes gsm8k's rows and MT-Bench's first
    turn, with a report that says where it stopped."""
    def fail(*args):
        raise RuntimeError("no room for the second turn")

    monkeypatch.setattr(e2e, "carried_answer", fail)
    target, drafter = tiny_pair
    out = tmp_path / "out"
    rc = cli.main(["bench", "--target", str(target), "--drafter", str(drafter), "--datasets", str(prompt_dir),
                   "--benchmarks", "gsm8k,mt-bench", "--limit", "2", "--max-new-tokens", "5", "--dtype", "fp32",
                   "--device", "cpu", "--methods", "our_ar", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "no room for the second turn" in err and "rows measured before the error" in err
    assert [(r["benchmark"], r["turn"]) for r in _rows(out)] == [("gsm8k", 0), ("gsm8k", 0), ("mtbench", 0)]
    md = (out / "report.md").read_text()
    assert "Stopped early" in md and "RuntimeError: no room for the second turn" in md


def test_hf_static_cache_is_sized_per_prompt_in_buckets(tiny_pair, rng):
    from specpilot.bench import hf_baseline

    pair = hf_baseline.load_hf_pair(tiny_pair[0], None, "cpu", __import__("torch").float32)
    bucket = hf_baseline.STATIC_CACHE_BUCKET
    k = rng.randint(1, 4)
    first, new = pair.static_cache_for(k * bucket - rng.randint(0, bucket - 1))
    assert new and first.max_cache_len == k * bucket
    again, new = pair.static_cache_for(k * bucket)
    assert again is first and not new
    longer, new = pair.static_cache_for(k * bucket + 1)
    assert new and longer.max_cache_len == (k + 1) * bucket


def test_second_turn_follows_reference_method(rng):
    """MT-Bench's second turn is asked after stock's answer (DFlash feeds its spec output)."""
    seen = {}

    def method(name, letter):
        def fn(ids, n, i, transcript):
            seen.setdefault(name, []).append("".join(map(chr, ids)))
            return MethodRun(tokens=[ord(letter)] * n, prefill_s=0.1, decode_s=0.2,
                             acceptance_lengths=[1] * n if name in ("stock", "our_spec") else None)
        return fn

    runners = e2e.Runners(fns={"our_ar": method("our_ar", "a"), "stock": method("stock", "s"),
                               "our_spec": method("our_spec", "o")}, block_size=4)
    u1, u2 = _text(rng, 5), _text(rng, 5)
    n = rng.randint(1, 4)
    rows = e2e.run_benchmark("mtbench", [Sample("mt/1", (u1, u2))], _CharTokenizer(), runners, n)
    assert [(r["turn"], r["method"]) for r in rows] == [(t, m) for t in (0, 1) for m in ("our_ar", "stock", "our_spec")]
    for name in runners.fns:
        assert seen[name] == [u1, u1 + "s" * n + u2]


def test_cli_random_preset_scale_tier(prompt_dir, tmp_path, capsys):
    """random:<preset> builds our pair in memory; no stop token, so every prompt runs to the cap."""
    out = tmp_path / "out"
    rc = cli.main(["bench", "--target", "random:tiny-qwen3", "--datasets", str(prompt_dir), "--benchmarks", "gsm8k",
                   "--limit", "2", "--max-new-tokens", "12", "--block-size", "4", "--dtype", "fp32",
                   "--methods", "our_ar,our_spec", "--replay", "3", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = _rows(out)
    assert len(rows) == 4 and all(r["new_tokens"] == 12 for r in rows)
    md = (out / "report.md").read_text()
    assert "Fidelity tier: scale" in md and "random 2-layer DFlash drafter" in md
    rc = cli.main(["bench", "--target", "random:tiny-qwen3", "--datasets", str(prompt_dir), "--methods", "stock"])
    assert rc == 2 and "builds our models only" in capsys.readouterr().err


def test_fastest_of_keeps_least_decode_time_and_checks_outputs(rng, capsys):
    times = [rng.uniform(0.1, 1.0) for _ in range(rng.randint(2, 5))]
    calls = iter(times)
    best = e2e.fastest_of(lambda: MethodRun([1, 2], 0.01, next(calls)), len(times))
    assert best.decode_s == min(times)
    assert "warning" not in capsys.readouterr().err
    outs = iter([MethodRun([1, 2], 0.01, 0.2), MethodRun([1, 3], 0.01, 0.1)])
    best = e2e.fastest_of(lambda: next(outs), 2)
    assert best.tokens == [1, 3]  # the faster call, with a warning that outputs differed
    assert "output changed between repeats" in capsys.readouterr().err


def test_random_checkpoint_writes_a_loadable_sharded_pair(tmp_path, rng, capsys):
    """bench.random_checkpoint (the scale tier's on-disk pair for stock / HF) writes a pair that our
    loader reads back with the preset's shapes and the bf16 dtype asked for."""
    import torch

    from specpilot.bench import random_checkpoint
    from specpilot.engine.cli_support import load_pair

    assert random_checkpoint.main(["--preset", "tiny-llama", "--out", str(tmp_path / "r"),
                                   "--seed", str(rng.randrange(2**31))]) == 0
    assert "written in" in capsys.readouterr().out
    assert (tmp_path / "r/target/model.safetensors.index.json").exists()
    target, drafter, tok = load_pair(tmp_path / "r/target", tmp_path / "r/drafter", "cpu", "bf16")
    assert target.dtype == torch.bfloat16 and target.config.hidden_size == 64
    assert drafter.config.num_layers == 2 and tok.vocab_size >= 258


def test_random_checkpoint_configs_only_is_what_the_cost_model_reads(tmp_path, capsys):
    """--configs-only writes the 8B pair's two config.json files and no weights; the cost model's
    shapes read them (Qwen3-8B: 36 layers, 5-layer drafter on 5 target layers, block 16)."""
    from specpilot.bench import random_checkpoint
    from specpilot.cost.gaps import _drafter_block_size
    from specpilot.cost.shapes import ModelShape, drafter_target_layers

    out = tmp_path / "cfg"
    assert random_checkpoint.main(["--preset", "qwen3-8b", "--out", str(out), "--configs-only"]) == 0
    assert "(configs only)" in capsys.readouterr().out
    assert sorted(p.name for p in out.rglob("*")) == ["config.json", "config.json", "drafter",
                                                      "generation_config.json", "target"]
    target, drafter = ModelShape.from_dir(out / "target"), ModelShape.from_dir(out / "drafter")
    assert (target.layers, target.vocab, drafter.layers) == (36, 151936, 5)
    assert drafter_target_layers(out / "drafter") == 5 and _drafter_block_size(out / "drafter") == 16
