"""The concurrency benchmark's pieces on a tiny random pair (CPU): closed-loop runs, the table, the plot."""
import json

import pytest
import torch

from batch_helpers import random_prompts, tiny_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.bench import concurrency


def test_levels_parse():
    assert concurrency.parse_levels("1,2,8") == [1, 2, 8]
    for bad in ("", "0,2", "a"):
        with pytest.raises(ValueError, match="comma list of ints"):
            concurrency.parse_levels(bad)


def test_ablations_select_by_name_in_order():
    runs = {"spec": 1, "no_ragged_verify": 2, "with_prefix_first": 3}
    assert concurrency.select_ablations(runs, None) == runs
    assert list(concurrency.select_ablations(runs, "with_prefix_first,spec")) == ["with_prefix_first", "spec"]
    for bad in ("", "spec,nope"):
        with pytest.raises(ValueError, match="choose from spec,no_ragged_verify,with_prefix_first"):
            concurrency.select_ablations(runs, bad)


def test_closed_loop_rows_table_and_plot(tmp_path):
    target, drafter = tiny_pair(10, 8, 5)                # block 8: room for the prefix-first row's P = 4
    prompts = random_prompts(10, (4, 7, 5, 9, 6), 5)
    rows = concurrency.run_levels(target, drafter, prompts, [1, 2], 25, replay_tau=2.5, log=open("/dev/null", "w"))
    assert {(r["method"], r["concurrency"]) for r in rows} == {(m, c) for c in (1, 2)
                                                               for m in ("ar", *concurrency.ABLATIONS)}
    for r in rows:
        assert r["tokens"] == 5 * 25 and r["prompts"] == 5 and r["tokens_per_s"] > 0
        assert r["ttft_p50_ms"] <= r["ttft_p99_ms"]
    spec = [r for r in rows if r["method"] in ("spec", "with_prefix_first")]
    assert all(abs(r["tau"] - 2.5) < 0.3 and r["replay_shortfalls"] == 0 for r in spec)
    concurrency.write(rows, {"target": "tiny", "device": "cpu"}, tmp_path)
    md = (tmp_path / "concurrency.md").read_text()
    assert md.count("\n| 1 |") == 1 and md.count("\n| 2 |") == 1
    assert (tmp_path / "concurrency.png").stat().st_size > 1000
    assert len((tmp_path / "concurrency.jsonl").read_text().splitlines()) == len(rows)
    assert json.loads((tmp_path / "concurrency.jsonl").read_text().splitlines()[0])["method"] == "ar"


def test_bench_concurrency_command(tmp_path, capsys):
    from pathlib import Path

    from specpilot.cli import main

    datasets = tmp_path / "data"
    datasets.mkdir()
    for name in ("gsm8k", "humaneval"):
        (datasets / f"{name}.jsonl").write_text("".join(json.dumps({"id": f"{name}{i}", "turns": [f"q{i} {name}"]}) + "\n"
                                                        for i in range(3)))
    out = tmp_path / "out"
    rc = main(["bench", "--target", "random:tiny-qwen3", "--concurrency", "1,2", "--datasets", str(datasets),
               "--benchmarks", "gsm8k,humaneval", "--limit", "2", "--max-new-tokens", "6", "--replay", "2",
               "--device", "cpu", "--dtype", "fp32", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "| 1 |" in printed and "| 2 |" in printed
    assert {p.name for p in Path(out).iterdir()} >= {"concurrency.jsonl", "concurrency.md", "concurrency.png"}


def test_poisson_arrivals_are_seeded_and_at_the_rate():
    times = concurrency.poisson_arrivals(4000, rate=50.0)
    assert times[0] == 0.0 and all(b >= a for a, b in zip(times, times[1:]))
    assert times == concurrency.poisson_arrivals(4000, rate=50.0)
    assert abs(len(times) / times[-1] - 50.0) < 5.0                    # 4000 gaps: within ~3 sigma of the rate
    with pytest.raises(ValueError, match="must be > 0 requests per second"):
        concurrency.poisson_arrivals(3, rate=0.0)


def test_open_loop_submits_at_arrival_times_and_counts_ttft_from_them():
    """Arrivals far apart: each request runs alone, after its arrival (the wall covers the last
    arrival); with every arrival at 0 and C=2, the later requests queue, so TTFT p99 grows."""
    target, drafter = tiny_pair(10, 4, 5)
    prompts = random_prompts(10, (4, 7, 5), 5)
    spread, results = concurrency.closed_loop(target, drafter, concurrency.BatchConfig(), 2, prompts, 6,
                                              arrivals=[0.0, 0.3, 0.6])
    assert spread["seconds"] >= 0.6 and [len(r.tokens) for r in results] == [6, 6, 6]
    burst, _ = concurrency.closed_loop(target, drafter, concurrency.BatchConfig(), 1, prompts, 6, arrivals=[0.0] * 3)
    assert burst["ttft_p99_ms"] > burst["ttft_p50_ms"] > 0
    assert burst["seconds"] < spread["seconds"]


def test_base_config_reaches_batched_ar_and_every_run(monkeypatch):
    """--prefill-chunk N: batched AR and every run beside it get the base config, each run with its
    own changes on top, so both sides of a speedup prefill alike."""
    seen = []

    def fake_closed_loop(target, drafter, config, *args, **kwargs):
        seen.append((drafter is not None, config))
        return {"tokens_per_s": 1.0, "tau": None}, []
    monkeypatch.setattr(concurrency, "closed_loop", fake_closed_loop)
    base = concurrency.BatchConfig(prefill_chunk=1024)
    ablations = {"spec": {}, "no_adaptive_verify": {"adaptive_verify": False}}
    rows = concurrency.run_levels("target", "drafter", [[1, 2]], [4], 8, ablations=ablations, base=base,
                                  log=open("/dev/null", "w"))
    assert [r["method"] for r in rows] == ["ar", "spec", "no_adaptive_verify"]
    assert all(config.prefill_chunk == 1024 for _, config in seen) and len(seen) == 6     # 3 warm-ups + 3 runs
    assert [c.adaptive_verify for drafted, c in seen[3:]] == [True, True, False]
    assert not seen[3][0] and seen[4][0]                                                  # AR runs without the drafter


def test_a_failed_run_is_a_row_and_the_rest_go_on(monkeypatch, tmp_path):
    """One run's RuntimeError (on a GPU: a failed CUDA graph capture) becomes a row with its error; the
    other runs still run, the table says `failed`, the plot skips it, and the command exits 1."""
    def fake_closed_loop(target, drafter, config, concurrency_level, *args, **kwargs):
        if not config.adaptive_verify and concurrency_level == 8:
            raise RuntimeError("capturing the batched engine's target graph failed")
        return {"tokens_per_s": 2.0 if drafter else 1.0, "tau": 3.0, "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0,
                "tpot_p50_ms": 1.0, "tpot_p99_ms": 1.0, "verified_rows_share": 1.0, "concurrency": concurrency_level}, []
    monkeypatch.setattr(concurrency, "closed_loop", fake_closed_loop)
    ablations = {"spec": {}, "no_adaptive_verify": {"adaptive_verify": False}}
    rows = concurrency.run_levels("target", "drafter", [[1, 2]], [2, 8], 8, ablations=ablations,
                                  log=open("/dev/null", "w"))
    assert [(r["method"], r["concurrency"]) for r in rows] == [
        ("ar", 2), ("spec", 2), ("no_adaptive_verify", 2), ("ar", 8), ("spec", 8), ("no_adaptive_verify", 8)]
    assert [r["concurrency"] for r in concurrency.failed(rows)] == [8]
    assert "capturing" in concurrency.failed(rows)[0]["error"]
    concurrency.write(rows, {"target": "tiny", "device": "cpu"}, tmp_path)
    md = (tmp_path / "concurrency.md").read_text()
    assert "| 8 | 1.0 | 2.0 | 2.00x |" in md and "| failed |" in md and "| 2.00x |" in md


def test_table_rows_have_the_header_columns_and_step_times():
    """Every row of the table (a measured one, a failed one) has the header's columns; the spec steps'
    mean times with and without a prefill chunk come from the run's rows."""
    def row(method, c, **extra):
        return {"method": method, "concurrency": c, "tokens_per_s": 2.0 if method != "ar" else 1.0, "tau": 3.0,
                "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0, "tpot_p50_ms": 1.0, "tpot_p99_ms": 1.0,
                "verified_rows_share": 1.0, "prefill_step_share": 0.5, "speedup": 2.0 if method != "ar" else 1.0,
                **extra}
    rows = [row("ar", 4), row("spec", 4, prefill_step_ms=21.5, decode_step_ms=10.25),
            row("ar", 8), {"method": "spec", "concurrency": 8, "error": "capture failed", "speedup": None}]
    lines = [line for line in concurrency.markdown(rows, {"target": "t"}).splitlines() if line.startswith("|")]
    assert len(lines) == 4 and len({line.count("|") for line in lines}) == 1
    assert "| 21.50 / 10.25 |" in lines[2] and "| failed |" in lines[3]


def test_spec_rows_carry_the_closed_loop_at_the_ceilings():
    """A spec row's `ceiling_model` is cost/batched.py's closed loop for the run (its prompts' mean
    length, new tokens, chunk, the row's tau, the best fixed verify lengths of decode and chunk steps);
    the table shows it last;
    a CPU run says why it has none."""
    from types import SimpleNamespace

    import torch

    from specpilot.cost.batched import CARDS, Acceptance, closed_loop
    from specpilot.cost.two_level import preset_shapes

    target, drafter = preset_shapes("qwen3-8b", 5)
    rows = [{"method": "ar", "concurrency": 8, "tokens_per_s": 1.0, "speedup": 1.0, "tau": None},
            {"method": "spec", "concurrency": 8, "tokens_per_s": 3.0, "speedup": 3.0, "tau": 6.0, "ttft_p50_ms": 1.0,
             "ttft_p99_ms": 2.0, "tpot_p50_ms": 1.0, "tpot_p99_ms": 1.0, "verified_rows_share": 0.5}]
    prompts = [[1] * 200, [1] * 400]
    concurrency.add_ceiling_model(rows, (target, drafter, 5, 16), prompts, 256, 256, "H100")
    assert "ceiling_model" not in rows[0]
    want = max(closed_loop(target, drafter, 5, 8, Acceptance.geometric(6.0, 16), CARDS["H100"], 256, 300.0, 256,
                           weights="bf16", context=428, verify_len=n, mixed_verify_len=m)["speedup_over_ar"]
               for n in range(1, 17) for m in range(1, 17))
    assert rows[1]["ceiling_model"] == pytest.approx(want, rel=0.02) and 1.0 < want < 16
    assert concurrency.markdown(rows, {}).splitlines()[-1].endswith(f"| {rows[1]['ceiling_model']:.2f}x |")
    cpu = SimpleNamespace(device=torch.device("cpu"), config=SimpleNamespace())
    assert concurrency.ceiling_model_card(SimpleNamespace(dtype="bf16"), cpu, None, None) == \
        (None, "not computed: no stated ceilings for this device")


def test_batch_host_bench_replays_for_free():
    """bench/batch_host.py: a FreeReplay runs its function once, later calls take new inputs and return
    the first outputs; the bench reports a positive host time per decode step."""
    from specpilot.bench.batch_host import FreeReplay, host_ms_per_step

    calls = []
    step = FreeReplay(lambda x: calls.append(1) or x * 2, (torch.ones(2),))
    first = step(torch.ones(2))
    again = step(torch.full((2,), 5.0))
    assert len(calls) == 1 and again is first and torch.equal(step.inputs[0], torch.full((2,), 5.0))
    assert host_ms_per_step(2, steps=3) > 0
