"""The loop end to end on the CPU: CPU-runnable candidates, injected (fake) timings, fake forcing.
The injected times make the ranking known, so the tests check the loop's decisions against it:
the round's winner is the fastest passing candidate, noise alone never wins, memory keeps the best,
and nothing is integrated unless forcing ran with the variant dispatched."""
import json

import pytest
from agents_helpers import FakeForcer, tiny_drafter, tiny_target

from specpilot.agents.loop import LoopConfig, run_optimize
from specpilot.agents.memory import Memory
from specpilot.kernels import registry


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    return tmp_path


def _cfg(tmp_path, target, **kw):
    base = dict(target_dir=str(target), ops=("split12_gemv",), rounds=3, agents=2, per_agent=2,
                memory_url=f"sqlite:///{tmp_path / 'mem.sqlite'}", timer={"kind": "fake"}, out_dir=str(tmp_path / "out"))
    base.update(kw)
    return LoopConfig(**base)


def test_loop_improves_integrates_reports_and_transfers(cache_env):
    tmp = cache_env
    forcer, logs = FakeForcer(True), []
    summary = run_optimize(_cfg(tmp, tiny_target(tmp / "t1")), forcer=forcer, log=logs.append)
    mem = Memory(str(tmp / "mem.sqlite"))
    rounds = mem.rounds(summary["run_id"])
    assert [r["status"] for r in rounds] == ["done"] * 3
    winners = [r for r in rounds if r["winner"]]
    assert winners, "the naive start must be beaten by some template variant"
    from specpilot.agents.timing import synthetic_gemv_time

    for r in winners:
        assert r["after_s"] < r["before_s"] and r["integrated"] == 1
        # the winner is the fastest candidate that passed in its round under the injected model
        judged = mem.evaluated(summary["run_id"], r["round"])
        passing = [c for c in mem.round_candidates(summary["run_id"], r["round"]) if judged[c.cand_id]["passed"]]
        fastest = min(passing, key=lambda c: synthetic_gemv_time(c, c.shape))
        winner = mem.candidate(r["winner"])
        assert synthetic_gemv_time(winner, winner.shape) == synthetic_gemv_time(fastest, fastest.shape)
    # memory holds each gap's best integrated result over all rounds (never overwritten by a slower one)
    mechs = {(m["op"], "x".join(map(str, m["shape"]))): m for m in mem.mechanisms(summary["deployment"])}
    for key in {r["gap_key"] for r in winners}:
        best = min((r for r in winners if r["gap_key"] == key), key=lambda r: r["after_s"])
        gap_op, shape = key.split(":")
        m = mechs[(gap_op, shape)]
        assert m["cand_id"] == best["winner"] and m["integrated"] == 1
        entry = registry.integrated_variant("cpu", gap_op, tuple(int(v) for v in shape.split("x")))
        assert entry is not None and entry["cand_id"] == m["cand_id"]
    # the variant was in the registry while the engine was token-forced
    for call in forcer.calls:
        assert any(v["cand_id"] == call["variant"]["cand_id"] for v in call["registry"].values())
    assert len(forcer.calls) == len(winners)
    # the cost model's gaps were recorded, and every judged candidate has verdicts
    assert mem.gaps(summary["run_id"])
    assert all(v["reason"] == "" for v in mem.verdict_rows(summary["run_id"]) if v["passed"])
    report = open(summary["report_path"]).read()
    assert "Before / after per gap" in report and "fake" in report and "not kernel results" in report
    assert any(line.startswith("[round 0]") for line in logs)

    # a new deployment starts from the nearest deployment's validated mechanisms
    summary2 = run_optimize(_cfg(tmp, tiny_target(tmp / "t2", hidden_size=128, intermediate_size=160), rounds=1),
                            forcer=forcer, log=logs.append)
    transfers = mem.transfers(summary2["run_id"])
    assert transfers and all(t["from_deployment"] == summary["deployment"] for t in transfers)
    first = mem.round_candidates(summary2["run_id"], 0)
    assert any(c.proposer == "transfer" for c in first)
    assert "Transferred mechanisms" in open(summary2["report_path"]).read()


def test_noise_alone_never_wins(cache_env):
    # every variant takes the same time; 30% noise per sample: a 1% rule would pick noise winners
    tmp = cache_env
    timer = {"kind": "fake", "model": "agents_helpers:flat_time", "noise": 0.3, "seed": 7}
    summary = run_optimize(_cfg(tmp, tiny_target(tmp / "t"), rounds=2, timer=timer), forcer=FakeForcer(True),
                           log=lambda m: None)
    mem = Memory(str(tmp / "mem.sqlite"))
    rounds = mem.rounds(summary["run_id"])
    assert [r["winner"] for r in rounds] == [None, None], [r["note"] for r in rounds]
    notes = [r["note"] for r in rounds]
    assert all("beyond the noise" in n or n == "no candidate beat the incumbent" for n in notes), notes
    assert any("beyond the noise" in n for n in notes), notes  # the paired re-timing was exercised
    assert mem.mechanisms(summary["deployment"]) == []


def test_forcing_without_the_variant_dispatched_does_not_integrate(cache_env):
    tmp = cache_env
    summary = run_optimize(_cfg(tmp, tiny_target(tmp / "t"), rounds=1), forcer=FakeForcer(True, dispatched=False),
                           log=lambda m: None)
    (r,) = Memory(str(tmp / "mem.sqlite")).rounds(summary["run_id"])
    assert r["winner"] and r["integrated"] == 0 and "variant_dispatched=False" in r["note"]
    path = registry.variants_file()
    assert not path.exists() or json.loads(path.read_text()) == {}


def test_failed_token_forcing_leaves_registry_untouched(cache_env):
    tmp = cache_env
    summary = run_optimize(_cfg(tmp, tiny_target(tmp / "t"), rounds=1), forcer=FakeForcer(False), log=lambda m: None)
    mem = Memory(str(tmp / "mem.sqlite"))
    (r,) = mem.rounds(summary["run_id"])
    assert r["integrated"] == 0 and "fake forcing failed" in r["note"]
    path = registry.variants_file()
    assert not path.exists() or json.loads(path.read_text()) == {}
    (m,) = mem.mechanisms(summary["deployment"])
    assert m["integrated"] == 0 and m["evidence"]["forcing"]["passed"] is False


def test_block_size_knob_is_gated_by_token_forcing(cache_env):
    tmp = cache_env
    calls = []

    def evaluator(block_size):  # fake engine: 8 is fastest, 12 breaks token forcing
        from specpilot.agents.forcing import ForcingOutcome

        calls.append(block_size)
        ok = block_size != 12
        return {"tokens_per_s": 100.0 - abs(block_size - 8) * 5,
                "forcing": ForcingOutcome(ok, "fake forcing " + ("passed" if ok else "failed: 2 mismatches"))}

    cfg = _cfg(tmp, tiny_target(tmp / "t"), drafter_dir=str(tiny_drafter(tmp / "d")), ops=("engine.block_size",),
               rounds=2, per_agent=3, block_size=16)
    summary = run_optimize(cfg, forcer=FakeForcer(True), knob_evaluator=evaluator, log=lambda m: None)
    mem = Memory(str(tmp / "mem.sqlite"))
    rows = mem.verdict_rows(summary["run_id"])
    assert any(r["label"] == "block_size=12" and not r["passed"] and "mismatches" in r["reason"] for r in rows)
    best = mem.mechanisms(summary["deployment"])[0]
    assert best["params"]["block_size"] in calls and best["params"]["block_size"] != 12
    assert best["after_s"] < best["before_s"]
