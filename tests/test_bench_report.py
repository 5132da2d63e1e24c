"""bench/metrics.py + bench/report.py: numbers from known rows, and the files written."""
import json
import os
import random

import pytest

from specpilot.bench import metrics, report
from specpilot.bench.rows import MethodRun, make_row

BS = 8


@pytest.fixture
def rng():
    """Fresh inputs every run; the seed is printed so a failure can be reproduced."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return random.Random(seed)


def _rows(rng, benchmark, n_prompts, methods=("hf_ar", "our_ar", "stock", "our_spec")):
    """Random rows: per prompt a shared transcript; our_spec equals stock on a random subset."""
    rows, same = [], []
    for i in range(n_prompts):
        base = [rng.randrange(100) for _ in range(rng.randint(3, 30))]
        identical = rng.random() < 0.5
        same.append(identical)
        for m in methods:
            tokens = list(base)
            if m == "our_spec" and not identical:
                tokens[-1] += 1
            acc = None
            if m in ("stock", "our_spec"):
                acc, left = [], len(tokens)
                while left:  # split the tokens into verify steps of 1..BS
                    a = min(left, rng.randint(1, BS))
                    acc.append(a)
                    left -= a
            run = MethodRun(tokens=tokens, prefill_s=rng.uniform(0.01, 0.1),
                            decode_s=rng.uniform(0.05, 2.0), acceptance_lengths=acc)
            rows.append(make_row(benchmark, f"{benchmark}/{i}", 0, i, m, rng.randint(5, 50), run))
    return rows, same


def _mean(xs):
    return sum(xs) / len(xs)


def test_tau_histogram_speedups_agreement(rng):
    rows, same = _rows(rng, "gsm8k", rng.randint(2, 7))
    s = metrics.summarize(rows, BS)["gsm8k"]

    def of(m):
        return [r for r in rows if r["method"] == m]

    tpot = {m: _mean([r["decode_s"] / len(r["tokens"]) for r in of(m)])
            for m in ("hf_ar", "our_ar", "stock", "our_spec")}
    for m, t in tpot.items():
        assert s["methods"][m]["tokens_per_s"] == pytest.approx(1 / t)
        assert s["methods"][m]["prompts"] == len(of(m))
    assert s["speedups"]["our_spec/hf_ar"] == pytest.approx(tpot["hf_ar"] / tpot["our_spec"])
    assert s["speedups"]["our_spec/our_ar"] == pytest.approx(tpot["our_ar"] / tpot["our_spec"])
    assert s["speedups"]["stock/hf_ar"] == pytest.approx(tpot["hf_ar"] / tpot["stock"])
    for m in ("stock", "our_spec"):
        accs = [r["acceptance_lengths"] for r in of(m)]
        assert s["methods"][m]["tau"] == pytest.approx(_mean([_mean(a) for a in accs]))
        flat = [a for acc in accs for a in acc]
        assert s["histograms"][m] == [flat.count(k) for k in range(1, BS + 1)]
    assert s["methods"]["hf_ar"]["tau"] is None and "hf_ar" not in s["histograms"]
    assert s["agreement"]["our_spec/stock"] == (sum(same), len(same))
    assert s["agreement"]["our_ar/hf_ar"] == (len(same), len(same))


def test_speedup_uses_only_prompts_both_ran(rng):
    rows, _ = _rows(rng, "mbpp", 4, methods=("hf_ar", "our_spec"))
    dropped = rows.pop(0)  # hf_ar of prompt 0 missing
    assert dropped["method"] == "hf_ar"
    kept = [r for r in rows if r["sample_id"] != dropped["sample_id"]]
    want = (_mean([r["time_per_token_s"] for r in kept if r["method"] == "hf_ar"])
            / _mean([r["time_per_token_s"] for r in kept if r["method"] == "our_spec"]))
    assert metrics.speedup(rows, "our_spec", "hf_ar") == pytest.approx(want)
    assert metrics.speedup(rows, "our_spec", "stock") is None


def test_pooled_summary_over_benchmarks(rng):
    a, _ = _rows(rng, "gsm8k", 3)
    b, _ = _rows(rng, "humaneval", 2)
    summary = metrics.summarize(a + b, BS)
    assert list(summary) == ["gsm8k", "humaneval", "all"]
    assert summary["all"]["histograms"]["stock"] == [
        x + y for x, y in zip(summary["gsm8k"]["histograms"]["stock"], summary["humaneval"]["histograms"]["stock"])]
    assert summary["all"]["methods"]["our_spec"]["prompts"] == 5


def test_histogram_rejects_out_of_range():
    row = make_row("b", "b/0", 0, 0, "our_spec", 3, MethodRun([1, 2], 0.1, 0.1, [BS + 1]))
    with pytest.raises(ValueError, match=f"acceptance length {BS + 1} outside 1..{BS}"):
        metrics.histogram([row], BS)


def _info(tier="real", replay=None):
    return {"date": "d", "tier": tier, "replay": replay, "device": "cpu (test)", "dtype": "float32",
            "weights": "bf16", "target": "/t/target", "drafter": "/t/drafter", "block_size": BS,
            "max_new_tokens": 32, "limit": 3, "methods": ["hf_ar", "our_ar", "stock", "our_spec"],
            "versions": report.versions()}


def test_write_all_files(tmp_path, rng):
    rows = _rows(rng, "gsm8k", 3)[0] + _rows(rng, "mtbench", 2)[0]
    text, summary = report.write_all(rows, _info("scale", "fixed tau 6.49 (block 8, 1 prompt(s), tau 6.49)"), tmp_path)
    for name in ("rows.jsonl", "report.md", "report.png", "run_info.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert back == rows
    md = (tmp_path / "report.md").read_text()
    assert md == text
    assert "Fidelity tier: scale" in md and "fixed tau 6.49" in md and "torch" in md
    ours = summary["gsm8k"]["speedups"]["our_spec/hf_ar"]
    assert "Identical outputs at scale" in md and "replay overrides" in md      # a scale-tier run says why
    assert report.scale_outputs_note(summary, _info("real")) == ""
    # the first three gsm8k rows: throughput, speedups, identical outputs (the histogram's follow)
    throughput, speedups, agreement = [line for line in md.splitlines() if line.startswith("| gsm8k |")][:3]
    assert f"{summary['gsm8k']['methods']['our_spec']['tokens_per_s']:.1f}" in throughput
    assert f"{ours:.2f}x" in speedups
    n_same, n = summary["gsm8k"]["agreement"]["our_spec/stock"]
    assert f"{n_same}/{n}" in agreement


def test_formats_pair_with_baselines_and_with_the_first_format(rng):
    """In a run over bf16 and split12, each format's methods pair with the HF baselines and with
    ours of the same format, and split12's with bf16's; a one-format run pairs as before."""
    formats = ["hf_static", "our_ar@bf16", "our_ar@split12", "our_spec@bf16", "our_spec@split12"]
    speedups = metrics.pairs(metrics.SPEEDUPS, formats)
    assert ("our_spec@split12", "hf_static") in speedups and ("our_spec@split12", "our_ar@split12") in speedups
    assert ("our_spec@split12", "our_ar@bf16") not in speedups
    assert ("our_ar@split12", "our_ar@bf16") in speedups and ("our_spec@split12", "our_spec@bf16") in speedups
    assert len(speedups) == len(set(speedups)) == 6
    assert metrics.pairs(metrics.SPEEDUPS, ["hf_static", "our_ar", "our_spec"]) == [
        ("our_spec", "our_ar"), ("our_spec", "hf_static")]
    rows = _rows(rng, "gsm8k", rng.randint(2, 5), methods=formats)[0]
    s = metrics.summarize(rows, BS)["gsm8k"]
    tpot = {m: _mean([r["decode_s"] / len(r["tokens"]) for r in rows if r["method"] == m]) for m in formats}
    assert s["speedups"]["our_ar@split12/our_ar@bf16"] == pytest.approx(tpot["our_ar@bf16"] / tpot["our_ar@split12"])
    assert report.speedup_label("our_spec@split12/hf_static") == "ours / HF static (split12)"
    assert report.speedup_label("our_ar@split12/our_ar@bf16") == "our AR (split12) / our AR (bf16)"
    summary = metrics.summarize(rows, BS)
    throughput = report.throughput_table(summary)
    assert throughput.splitlines()[0].startswith("| benchmark | prompts | HF static tok/s | our AR (bf16) tok/s")
    assert "our spec (split12) / our spec (bf16)" in report.speedup_table(summary).splitlines()[0]
    assert f"{s['speedups']['our_spec@split12/our_spec@bf16']:.2f}x" in report.speedup_table(summary)
    text = report.tables(summary)
    assert text.index("## Throughput and acceptance") < text.index("## Speedups") < text.index("## Identical")
