"""The drafter comparison bench (bench/drafter_steps.py) on tiny random pairs of every kind, CPU fp32:
the code path and the table are real, the timings are not."""
import json

import pytest
import torch

from conftest import requires_gpu
from specpilot.bench import drafter_steps
from specpilot.bench.drafter_floor import draft_floor, kv_read_bytes, whole_read_weights
from specpilot.bench.drafter_parts import steady_draft, without_extra
from specpilot.bench.random_pair import random_drafter_of
from specpilot.engine import Engine
from specpilot.engine.batch.kind_drafting import supported as batched_kinds
from specpilot.models.random_ckpt import TARGET_PRESETS, random_target

TINY = ["--preset", "tiny-qwen3", "--device", "cpu", "--context", "40", "--iters", "2", "--tau", "2",
        "--prompts", "2", "--prompt-tokens", "8", "--tokens", "12"]


@pytest.fixture(scope="module")
def target():
    return random_target(TARGET_PRESETS["tiny-qwen3"], "cpu", torch.float32, seed=0)


def test_bench_runs_every_kind_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "drafter_steps.json"
    assert drafter_steps.main(TINY + ["--concurrency", "1,2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["kind"]: r for r in result["kinds"]}
    assert list(rows) == ["dflash", "dflash2", "dspark", "pard"]
    assert [rows[k]["block"] for k in rows] == [16, 8, 8, 13]
    for kind, r in rows.items():
        assert r["draft_ms"] > 0 and r["floor_ms"] > 0 and r["verify_ms"] > 0 and r["ar_ms"] > 0
        assert r["draft_over_floor"] == pytest.approx(r["draft_ms"] / r["floor_ms"])
        assert ("extra_share" in r) == (kind != "dflash")
        one = r["e2e"]["1"]                 # replayed tau 2 over the AR transcript: the AR tokens exactly
        assert one["same_tokens_as_ar"] and one["replay_shortfalls"] == 0
        assert 1.5 < one["tau"] <= 2.0
        assert one["speedup"] == pytest.approx(one["spec_tokens_per_s"] / one["ar_tokens_per_s"])
        two = r["e2e"]["2"]
        if kind in batched_kinds():
            assert two["same_tokens_as_ar"] and two["replay_shortfalls"] == 0 and two["speedup"] > 0
        else:
            assert "kind_drafting.py" in two["skipped"]
    printed = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(printed[-1])
    assert set(summary["kinds"]) == set(rows)
    table = [line for line in printed if line.startswith("| ")]
    assert len(table) == 5 and "C=2 speedup" in table[0]
    for kind in rows:
        batched = summary["kinds"][kind]["speedup_c2"] is not None
        assert batched == (kind in batched_kinds())
        assert ("not batched (see below)" in next(line for line in table if line.startswith(f"| {kind} "))) != batched
    assert "x at tau 1.8" in next(line for line in table if line.startswith("| dflash "))
    unbatched = any(kind not in batched_kinds() for kind in rows)
    assert any(line.startswith("not batched: the batched engine drafts with dflash") for line in printed) == unbatched


def test_steps_only(tmp_path):
    out = tmp_path / "s.json"
    assert drafter_steps.main(TINY + ["--kinds", "pard", "--no-e2e", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["kinds"]
    assert "e2e" not in row and row["extra_ms"] == pytest.approx(row["draft_ms"] - row["without_extra_ms"])


@pytest.mark.parametrize("argv, problem", [
    (["--kinds", "dflash,eagle"], "--kinds"),
    (["--tau", "9"], "--tau 9.0 must be in [1, 8]"),
    (["--concurrency", "0"], "--concurrency"),
    (["--tokens", "0"], "--tokens=0"),
])
def test_bad_arguments_are_named(argv, problem, capsys):
    with pytest.raises(SystemExit):
        drafter_steps.parse_args(TINY + argv)
    assert problem in capsys.readouterr().err


@torch.inference_mode()
def test_pard_without_padding_drafts_the_same_tokens(target):
    """The unpadded K-row step does the work of the padded one: the same drafts (the pending tokens'
    K/V are in the cache from the padded step)."""
    drafter = random_drafter_of("pard", target, 2, 13)
    engine = Engine(target, drafter, max_seq_len=256)
    engine.runner = drafter_steps.graphed_runner(engine)
    s = steady_draft(engine, 13, 40, 3)
    assert len(s.session.pending) == 3
    padded = s.step().clone()
    assert torch.equal(without_extra(s)(), padded)
    assert ("pard", 24, 256) in engine.runner.graphs and ("pard-unpadded", 12, 256) in engine.runner.graphs


@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
@torch.inference_mode()
def test_without_extra_runs_the_same_backbone_graphed(target, kind):
    drafter = random_drafter_of(kind, target, 2, 8)
    engine = Engine(target, drafter, max_seq_len=256)
    engine.runner = drafter_steps.graphed_runner(engine)
    s = steady_draft(engine, 8, 40, 2)
    drafts = s.step()
    plain = without_extra(s)()
    assert drafts.shape == plain.shape == (1, 7)
    without = "dflash2-argmax" if kind == "dflash2" else "dspark-plain-head"
    assert {k[0] for k in engine.runner.graphs} >= {kind, without}


def test_floor_counts_whole_weights_once(target):
    d = random_drafter_of("dspark", target, 2, 8)        # own embedding and head, Markov W1 / W2
    gathered = {id(d.embed.weight), id(d.markov_w1.weight)}
    expected = sum(p.numel() * 4 for p in d.parameters() if id(p) not in gathered)
    f = draft_floor(d, target, 8, 40)
    assert f["weight_bytes"] == expected and f["flops"] == 2 * expected // 4 * 7
    assert f["kv_bytes"] == kv_read_bytes(d, 48, 4) == 2 * 2 * d.config.num_kv_heads * d.config.head_dim * 48 * 4

    flash = random_drafter_of("dflash", target, 2, 16)     # borrows the target's head
    assert id(target.lm_head.weight) in {id(p) for p in whole_read_weights(flash, target)}
    pard = random_drafter_of("pard", target, 2, 13)        # tied embedding and head: read whole, once
    weights = whole_read_weights(pard, target)
    assert pard.model.lm_head.weight is pard.model.embed.weight
    assert len(weights) == len({id(p) for p in pard.parameters()})
    assert id(target.lm_head.weight) not in {id(p) for p in weights}


def test_batched_engine_refuses_a_kind_it_cannot_draft(target, monkeypatch):
    from specpilot.engine.batch import BatchEngine, kind_drafting

    monkeypatch.delitem(kind_drafting.MODULES, "dflash2")        # a kind without a batched Drafting
    with pytest.raises(ValueError, match="dflash2 drafter runs single-request"):
        BatchEngine(target, random_drafter_of("dflash2", target, 2, 8), kv_pages=8)


@requires_gpu
def test_bench_on_cuda_graphs_every_kind(tmp_path):
    """The bench on a GPU at tiny shapes (fp32): real CUDA graphs for the draft steps and their
    variants without the extra part, CUDA-event timings, and both end-to-end engines."""
    out = tmp_path / "cuda.json"
    argv = [a for a in TINY if a not in ("--device", "cpu")]
    assert drafter_steps.main(argv + ["--device", "cuda", "--dtype", "fp32", "--concurrency", "1,4",
                                      "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["copy_bytes_per_s"] > 1e11 and result["matmul_flops_per_s"] > 1e12
    for r in result["kinds"]:
        assert 0 < r["floor_ms"] and r["draft_ms"] > 0 and ("without_extra_ms" in r) == (r["kind"] != "dflash")
        assert r["e2e"]["1"]["tau"] > 1.5 and r["e2e"]["1"]["speedup"] > 0
    assert result["kinds"][0]["e2e"]["4"]["speedup"] > 0


@requires_gpu
@torch.inference_mode()
def test_pard_without_padding_drafts_the_same_tokens_on_cuda():
    target = random_target(TARGET_PRESETS["tiny-qwen3"], "cuda", torch.float32, seed=0)
    engine = Engine(target, random_drafter_of("pard", target, 2, 13), max_seq_len=256)
    s = steady_draft(engine, 13, 40, 3)
    padded = s.step().clone()
    assert torch.equal(without_extra(s)(), padded)
    assert ("pard-unpadded", 12, 256) in engine.runner.graphs
