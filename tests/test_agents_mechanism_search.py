"""The mechanism search: its gate, its records in memory, transfer from memory, the cost-model
evaluator's directions, and a real engine search on the tiny random pair (CPU, fp32)."""
import json
from dataclasses import dataclass

import pytest
import torch

from specpilot import cli
from specpilot.agents.cost_evaluator import CostModelEvaluator, geometric_tau
from specpilot.agents.deployment import Deployment
from specpilot.agents.mechanism_search import gate, search_mechanisms
from specpilot.agents.memory import Memory

REF = [[1, 2, 3, 4], [5, 6, 7]]


def test_gate_passes_identical_outputs_and_names_the_first_fork():
    assert gate(REF, [[1, 2, 3, 4], [5, 6, 7]]) == ("pass", [])
    verdict, reasons = gate(REF, [[1, 2, 9, 4], [5, 6, 7]])
    assert verdict == "reject" and reasons == ["prompt 0: token 2 is 9, the reference's is 3"]
    verdict, reasons = gate(REF, [[1, 2, 3, 4], [5, 6]])
    assert verdict == "reject" and "token 2 is end" in reasons[0]
    assert gate(REF, [[1, 2, 3, 4]])[0] == "reject"
    assert gate(None, None)[0] == "estimate"


@dataclass
class Run:
    tokens_per_s: float
    outputs: list
    label: str = "fake"


class FakeEvaluator:
    """Speeds from a table of per-mechanism factors; engine.two_level=certified-head corrupts a token
    (a lossy mechanism the gate must catch) and batch.page_size=64 raises."""
    name, forced = "fake", True
    FACTORS = {("engine.cuda_graphs", True): 2.0, ("engine.fused_kernels", True): 1.3,
               ("run.weights", "split12"): 1.25, ("batch.ragged_verify", True): 3.0,
               ("engine.two_level", "certified-head"): 5.0}
    MODELLED = {"engine.cuda_graphs", "engine.fused_kernels", "engine.two_level", "run.weights",
                "batch.ragged_verify", "batch.page_size"}

    def __init__(self):
        self.calls = 0

    def models(self, m):
        return m.name in self.MODELLED

    def gaps(self, dep, a):
        return {"launches": 0.0 if a.get("engine.cuda_graphs") else 1.0, "weights": 0.5, "spec.linear": 0.7}

    def reference(self, dep):
        return REF

    def __call__(self, dep, a):
        self.calls += 1
        if a.get("batch.page_size") == 64:
            raise RuntimeError("page size 64 does not fit")
        speed = 100.0
        for (k, v), f in self.FACTORS.items():
            speed *= f if a.get(k) == v else 1.0
        out = [list(r) for r in REF]
        if a.get("engine.two_level") == "certified-head":
            out[1][2] = 0
        return Run(speed, out)


H100_16 = Deployment("qwen3-8b", "dflash-b16", "H100", 16, "split12")


def test_search_gates_records_and_finds_the_lossless_best(tmp_path):
    mem = Memory(str(tmp_path / "m.db"))
    ev = FakeEvaluator()
    r = search_mechanisms(H100_16, ev, mem, budget=30, log=lambda m: None)
    assert r.verdict == "pass" and r.baseline_tokens_per_s == 100.0
    assert r.best_config["engine.two_level"] == "off"          # 5x faster but lossy: rejected
    assert r.best_config["engine.cuda_graphs"] and r.best_config["batch.ragged_verify"]
    assert r.best_config["run.weights"] == "split12" and r.best_config["engine.fused_kernels"]
    assert r.best_tokens_per_s == pytest.approx(100 * 2 * 1.3 * 1.25 * 3)
    evals = mem.mech_evals(deployment=H100_16.key)
    assert len(evals) == r.evaluations == len(r.trajectory) == ev.calls
    lossy = [e for e in evals if e["changed"].get("engine.two_level") == "certified-head"]
    assert lossy and all(e["verdict"] == "reject" for e in lossy)
    assert "prompt 1: token 2 is 0, the reference's is 7" in lossy[0]["reasons"]
    crashed = [e for e in evals if e["changed"].get("batch.page_size") == 64]
    assert crashed[0]["verdict"] == "crash" and "page size 64" in crashed[0]["reasons"][0]
    assert r.trajectory == sorted(r.trajectory)                 # the best never gets worse
    assert [w["deployment"] for w in mem.mech_winners()] == [H100_16.key]
    # the launches family (largest gap at the start) is tried first
    assert evals[1]["changed"] == {"engine.cuda_graphs": True}


def test_budget_is_respected_and_a_failing_start_is_an_error(tmp_path):
    mem = Memory(str(tmp_path / "m.db"))
    r = search_mechanisms(H100_16, FakeEvaluator(), mem, budget=3, log=lambda m: None)
    assert r.evaluations == 3
    with pytest.raises(RuntimeError, match="start assignment failed its gate"):
        search_mechanisms(H100_16, FakeEvaluator(), mem, start={"engine.two_level": "certified-head"},
                          log=lambda m: None)
    with pytest.raises(ValueError, match="cannot search"):
        search_mechanisms(H100_16, FakeEvaluator(), mem, start={"engine.attention": "sdpa"}, log=lambda m: None)


def test_transfer_starts_from_the_nearest_validated_winner(tmp_path):
    mem = Memory(str(tmp_path / "m.db"))
    cold = search_mechanisms(H100_16, FakeEvaluator(), mem, budget=30, log=lambda m: None)
    other = Deployment("llama-3.1-8b", "dflash-b16", "H100", 16, "split12")
    warm = search_mechanisms(other, FakeEvaluator(), mem, budget=30, log=lambda m: None)
    assert warm.transferred_from == H100_16.key
    assert warm.trajectory[1] == cold.best_tokens_per_s          # the transferred winner, evaluated second
    assert warm.best_config == cold.best_config
    fresh = Memory(str(tmp_path / "estimates.db"))              # estimates never seed a forced search
    search_mechanisms(H100_16, CostModelEvaluator(), fresh, budget=5, log=lambda m: None)
    assert search_mechanisms(other, FakeEvaluator(), fresh, budget=5, log=lambda m: None).transferred_from is None


def test_cost_model_directions_and_gap_ranking():
    ev = CostModelEvaluator()
    c1 = Deployment("qwen3-8b", "dflash-b16", "H100", 1, "split12")
    spt = lambda d, **a: ev.seconds_per_token(d, {k.replace("__", "."): v for k, v in a.items()})  # noqa: E731
    assert spt(c1, run__weights="split12") < spt(c1, run__weights="bf16")
    assert spt(c1, engine__cuda_graphs=False) > spt(c1)
    assert spt(c1, batch__ragged_verify=False) == spt(c1)            # one request: nothing to batch
    assert spt(H100_16, batch__ragged_verify=False) > 2 * spt(H100_16)
    assert spt(c1, engine__two_level="certified-head") > spt(c1)    # at the measured fallback rate 1.0
    assert ev(c1, {}).outputs is None and "estimate" in ev(c1, {}).label
    gaps = ev.gaps(c1, {"engine.cuda_graphs": False})
    assert max(gaps, key=gaps.get) == "launches"
    assert geometric_tau(16, 6.49, 16) == pytest.approx(6.49, rel=1e-6)
    assert geometric_tau(4, 6.49, 16) < geometric_tau(8, 6.49, 16) < 6.49
    with pytest.raises(ValueError, match="no stated ceilings for card 'A100'"):
        ev(Deployment("qwen3-8b", "dflash-b16", "A100", 1, "bf16"), {})


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from specpilot.models.random_ckpt import write_pair

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("mech_pair")
    yield write_pair(base / "a", "tiny-llama", layer_ids=[1, 2], block_size=4, seed=3), \
        write_pair(base / "b", "tiny-llama", layer_ids=[1, 2], block_size=4, seed=4)
    torch.set_num_threads(saved)


def test_engine_search_on_the_tiny_pair_is_forced_and_recorded(tiny_pair, tmp_path, capsys):
    from specpilot.agents.engine_evaluator import EngineEvaluator

    (td, dd), _ = tiny_pair
    ev = EngineEvaluator(td, dd, [[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=12)
    mem = Memory(str(tmp_path / "m.db"))
    total = 0
    for c in (1, 2):
        dep = Deployment("tiny-llama", "dflash-b4", "cpu", c, "bf16")
        r = search_mechanisms(dep, ev, mem, budget=6, compare_shipped=True, log=lambda m: None)
        assert r.verdict == "pass" and r.shipped_tokens_per_s > 0 and 2 <= r.evaluations <= 6
        evals = mem.mech_evals(deployment=dep.key)
        assert len(evals) == r.evaluations + 1                  # the searched + the shipped reference
        total += len(evals)
        assert evals[0]["verdict"] == "pass" and evals[0]["label"].startswith("engine-cpu-float32")
        assert all(e["verdict"] == "pass" for e in evals)       # block sizes past the drafter's are not tried
        assert all(e["config"].get("run.block_size") in (None, 4) for e in evals)
    assert mem.mech_evals(deployment="cpu|tiny-llama|dflash-b4|C2|bf16")[0]["config"]["batch.ragged_verify"] is False
    path = str(tmp_path / "m.db")
    mem.close()
    assert cli.main(["memory", "show", "--memory", path]) == 0
    out = capsys.readouterr().out
    assert "mechanism winner (engine-cpu-float32, pass)" in out and "mechanism evaluations: " in out
    assert cli.main(["memory", "export", str(tmp_path / "x.json"), "--memory", path]) == 0
    data = json.loads((tmp_path / "x.json").read_text())
    assert len(data["mech_evals"]) == total and len(data["mech_winners"]) == 2


def test_batched_evaluation_warms_up_before_its_clock(tiny_pair, monkeypatch):
    """A batched evaluation captures its graphs and measures its step costs before it starts timing
    (a capture inside the timed run would price each candidate's hundreds of captures, not its steps),
    and closes its engine after the run."""
    from specpilot.agents.engine_evaluator import EngineEvaluator
    from specpilot.engine.batch import BatchEngine

    (td, dd), _ = tiny_pair
    calls = []
    for name in ("warmup", "submit", "close"):
        original = getattr(BatchEngine, name)
        monkeypatch.setattr(BatchEngine, name, lambda self, *a, _n=name, _f=original: calls.append(_n) or _f(self, *a))
    ev = EngineEvaluator(td, dd, [[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=12)
    ev(Deployment("tiny-llama", "dflash-b4", "cpu", 2, "bf16"), {})
    assert calls and calls[0] == "warmup" and calls[-1] == "close" and "submit" in calls, calls


def test_engine_search_chooses_among_drafters(tiny_pair, tmp_path):
    """Two drafters that fit the target (the second pair's drafter has the first target's shapes):
    run.drafter is searched, a run with each drafter is gated (fp32: the target's greedy output), and a
    third index (no such drafter) is never tried."""
    from specpilot.agents.engine_evaluator import EngineEvaluator
    from specpilot.agents.mechanisms import by_name

    (td, dd), (_, dd2) = tiny_pair
    ev = EngineEvaluator(td, [dd, dd2], [[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=12)
    assert ev.models(by_name()["run.drafter"]) and not EngineEvaluator(td, dd, [[5]]).models(by_name()["run.drafter"])
    assert ev.allows("run.drafter", 1) and not ev.allows("run.drafter", 2)
    dep = Deployment("tiny-llama", "a+b", "cpu", 2, "bf16")
    mem = Memory(str(tmp_path / "m.db"))
    start = {"run.drafter": 1}
    r = search_mechanisms(dep, ev, mem, budget=8, start=start, log=lambda m: None)
    evals = mem.mech_evals(deployment=dep.key)
    drafters_tried = {e["config"]["run.drafter"] for e in evals}
    assert r.verdict == "pass" and drafters_tried == {0, 1} and all(e["verdict"] == "pass" for e in evals)
    assert ev(dep, {"run.drafter": 1}).outputs == ev.reference(dep)
    with pytest.raises(ValueError, match="takes 1 to 4 drafters"):
        EngineEvaluator(td, [], [[5]])


def test_engine_gate_fails_against_another_pairs_reference(tiny_pair, tmp_path):
    """The gate is not a formality: the same prompts judged against another target's greedy output."""
    from specpilot.agents.engine_evaluator import EngineEvaluator

    (td, dd), (td2, dd2) = tiny_pair
    ev = EngineEvaluator(td, dd, [[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=12)
    other = EngineEvaluator(td2, dd2, [[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=12)
    ev.reference = other.reference
    dep = Deployment("tiny-llama", "dflash-b4", "cpu", 1, "bf16")
    with pytest.raises(RuntimeError, match="prompt 0: token"):
        search_mechanisms(dep, ev, Memory(str(tmp_path / "m.db")), budget=3, log=lambda m: None)


def test_transfer_study_reports_both_trajectories(tmp_path):
    from specpilot.agents.transfer_study import markdown, plot, reach, study

    assert reach([1.0, 90.0, 96.0, 100.0], 100.0) == 3 and reach([1.0], 100.0) is None
    src = Deployment("qwen3-8b", "dflash-b16", "H100", 1, "split12")
    dst = Deployment("llama-3.1-8b", "dflash-b16", "H100", 1, "split12")
    (row,) = study(CostModelEvaluator(), pairs=[("target shape", src, dst)], budget=40)
    assert row["transferred_from"] == src.key and row["evaluator"] == "cost-model"
    assert row["warm_reach"] < row["cold_reach"] and len(row["cold_trajectory"]) == row["cold_evaluations"]
    assert "estimates" in markdown([row]) and plot([row], tmp_path / "t.png").endswith("t.png")


def test_engine_evaluator_replays_tau_for_timing_and_gates_an_unreplayed_run(tiny_pair, tmp_path):
    from specpilot.agents.engine_evaluator import EngineEvaluator

    (td, dd), _ = tiny_pair
    ev = EngineEvaluator(td, dd, [[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=12, replay_tau=3.0)
    for c in (1, 2):
        dep = Deployment("tiny-llama", "dflash-b4", "cpu", c, "bf16")
        run = ev(dep, {})
        assert "tau 3.0 replayed" in run.label and run.tokens_per_s > 0
        assert gate(ev.reference(dep), run.outputs) == ("pass", [])


class ConfirmingEvaluator(FakeEvaluator):
    """No independent reference (as bf16): the start's confirmed outputs become it; confirm rejects
    engine.fused_kernels=True (a lossy change whose outputs happen to match: only the full verdict sees it)."""
    name = "confirming"

    def __init__(self):
        super().__init__()
        self.confirmed = []

    def reference(self, dep):
        return None

    def confirm(self, dep, a):
        self.confirmed.append(dict(a))
        if a.get("engine.fused_kernels"):
            return "reject", ["forced decode path: 3 unexcused mismatches"]
        return "pass", []


def test_full_verdict_confirms_the_start_and_every_new_incumbent(tmp_path):
    mem = Memory(str(tmp_path / "m.db"))
    ev = ConfirmingEvaluator()
    r = search_mechanisms(H100_16, ev, mem, budget=30, time_budget_s=600, log=lambda m: None)
    assert r.best_config["engine.fused_kernels"] is False and r.best_config["engine.cuda_graphs"]
    evals = mem.mech_evals(deployment=H100_16.key)
    rejected = [e for e in evals if e["changed"].get("engine.fused_kernels") is True]
    assert rejected[0]["verdict"] == "reject"
    assert rejected[0]["reasons"] == ["full verdict: forced decode path: 3 unexcused mismatches"]
    lossy = [e for e in evals if e["changed"].get("engine.two_level") == "certified-head"]
    assert lossy[0]["verdict"] == "reject" and "prompt 1: token 2" in lossy[0]["reasons"][0]
    incumbents = {frozenset(a.items()) for a in ev.confirmed}
    passed_better = [e for e in evals if e["verdict"] == "pass" and e["gain"] and e["gain"] > 0.01]
    assert all(frozenset(e["config"].items()) in incumbents for e in passed_better)
    assert len(ev.confirmed) < len(evals)              # only the start and would-be incumbents
    assert search_mechanisms(H100_16, ev, mem, budget=30, time_budget_s=0.0, log=lambda m: None).evaluations == 1


class NoisyEvaluator(FakeEvaluator):
    """A measured evaluator: its first timing of engine.fused_kernels=True is a lucky 40% fast outlier
    (true gain 0), while engine.cuda_graphs=True really is 2x; re-timings see the truth."""
    name, noisy = "noisy", True

    def __init__(self):
        super().__init__()
        self.retimed = 0

    def __call__(self, dep, a):
        run = super().__call__(dep, a)
        true = self.true_speed(a)
        return Run(true * (1.4 if a.get("engine.fused_kernels") else 1.0), run.outputs)

    def true_speed(self, a):
        return 100.0 * (2.0 if a.get("engine.cuda_graphs") else 1.0)

    def time(self, dep, a):
        self.retimed += 1
        return self.true_speed(a) * (1.0 + 0.001 * (self.retimed % 3))   # small honest noise


def test_a_noisy_evaluators_outlier_does_not_win_the_paired_re_timing(tmp_path):
    mem = Memory(str(tmp_path / "m.db"))
    ev = NoisyEvaluator()
    r = search_mechanisms(H100_16, ev, mem, budget=30, log=lambda m: None)
    assert r.best_config["engine.cuda_graphs"] is True
    assert r.best_config["engine.fused_kernels"] is False
    outlier = [e for e in mem.mech_evals(deployment=H100_16.key) if e["changed"].get("engine.fused_kernels") is True]
    assert outlier[0]["verdict"] == "pass" and "noise" in outlier[0]["label"]
    graphs = [e for e in mem.mech_evals(deployment=H100_16.key) if e["changed"] == {"engine.cuda_graphs": True}]
    assert "wins" in graphs[0]["label"] and ev.retimed > 0


def test_engine_evaluator_keeps_one_target_resident(tiny_pair):
    """Switching run.weights drops the other format's target (and its drafters) before loading: both
    8B formats beside the stock pair and the fp32 referee overflowed an 80 GB H100."""
    from specpilot.agents.engine_evaluator import EngineEvaluator

    (td, dd), _ = tiny_pair
    ev = EngineEvaluator(td, dd, [[5, 6, 7, 8]], max_new_tokens=4, dtype=torch.bfloat16)   # split12 is bf16
    loads = []
    load = ev._load_target
    ev._load_target = lambda *a, **kw: loads.append(kw.get("weights", "bf16")) or load(*a, **kw)
    bf16, _ = ev._pair("bf16")
    assert ev._pair("bf16")[0] is bf16 and loads == ["bf16"]          # resident: not loaded twice
    ev._pair("split12")
    assert list(ev._targets) == ["split12"] and [w for w, _ in ev._drafters] == ["split12"]
    ev._pair("bf16")
    assert loads == ["bf16", "split12", "bf16"] and list(ev._targets) == ["bf16"]
