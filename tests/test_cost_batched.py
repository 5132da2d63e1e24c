"""The batched step model (cost/batched.py): its limits against the single-request model, prefix-first's
pass 2 and the verify length, rows past the ridge, a prefill chunk in a step and the closed loop, the
CLI, and the agents' cost-model evaluator agreeing with it on the batched verify policies."""
import json

import pytest
from agents_helpers import tiny_drafter, tiny_target

from specpilot import cli
from specpilot.agents.cost_evaluator import CostModelEvaluator
from specpilot.agents.deployment import Deployment
from specpilot.agents.mechanisms import by_name
from specpilot.bench import traces
from specpilot.cost import cost_report
from specpilot.cost.batched import (CARDS, Acceptance, batched_step, best_verify_len, binomial_expectation,
                                    closed_loop, step_seconds)
from specpilot.cost.shapes import ModelShape, drafter_target_layers
from specpilot.cost.two_level import preset_shapes, step_ceilings

H100 = CARDS["H100"]
TAU3 = Acceptance.geometric(3.0, 16)


@pytest.fixture(scope="module")
def qwen():
    target, drafter = preset_shapes("qwen3-8b", 5)
    return target, drafter, 5


def step(qwen, c, acceptance=TAU3, **kw):
    target, drafter, feats = qwen
    return batched_step(target, drafter, feats, c, acceptance, H100, weights="bf16", context=512, **kw)


def test_acceptance_laws():
    assert TAU3.mean() == pytest.approx(3.0, rel=1e-9) and TAU3.block == 16
    assert TAU3.survival(1) == pytest.approx(1.0) and TAU3.survival(17) == 0.0
    assert TAU3.mean(4) < TAU3.mean(8) < TAU3.mean()
    shorter = Acceptance.geometric(6.49, 8, tau_block=16)      # the drafter's tau, stated at its block
    assert shorter.block == 8 and shorter.mean() < 6.49
    trace = Acceptance.from_lengths([1, 3, 3, 16], 16)
    assert trace.mean() == pytest.approx(23 / 4) and trace.survival(4) == pytest.approx(0.25)
    assert trace.mean(2) == pytest.approx((1 + 2 + 2 + 2) / 4)
    with pytest.raises(ValueError, match=r"ints in 1\.\.16"):
        Acceptance.from_lengths([0, 3], 16)
    with pytest.raises(ValueError, match="tau 17"):
        Acceptance.geometric(17, 16)
    assert binomial_expectation(32, 0.2, lambda k: k) == pytest.approx(32 * 0.2)
    assert binomial_expectation(32, 0.2, lambda k: 1.0) == pytest.approx(1 - 0.8 ** 32)


def test_one_request_is_the_single_request_model(tmp_path):
    """At C = 1 the steps are the single-request model's at the ceilings: cost_report's step bounds (its
    rows, summed by gaps.step_bounds) on a tiny pair, and two_level.step_ceilings on the Qwen3-8B shape."""
    t, d = tiny_target(tmp_path / "t"), tiny_drafter(tmp_path / "d", block_size=8)
    report = cost_report(t, d, batch=1, block_size=8, tau=3.0, context=64, device="cpu", weights="bf16",
                         quick=True, ceilings=H100)
    target, drafter = ModelShape.from_dir(t), ModelShape.from_dir(d)
    s = batched_step(target, drafter, drafter_target_layers(d), 1, Acceptance.geometric(3.0, 8), H100,
                     weights="bf16", context=64)
    # cost_report holds a step's untimed kernels against one launch (its ceiling: them fused); the step
    # model runs each at the launch floor, as the engine's graphs do: the only difference
    for name in ("decode", "draft", "verify"):
        untimed = next(r["shape"][0] for r in report.rows if r["step"] == name and r["kind"] == "launches")
        expected = report.bounds["steps"][name]["ceiling_s"] + (untimed - 1) * H100.launch_s
        assert s[f"{name}_s"] == pytest.approx(expected, rel=1e-12)
    qt, qd = preset_shapes("qwen3-8b", 5)
    single = step_ceilings(qt, qd, 5, 16, H100, "bf16", 512)
    batched = {k: sum(v.values()) for k, v in step_seconds(qt, qd, 5, 1, 16, H100, "bf16", 512).items()}
    assert batched == pytest.approx(single, rel=1e-12)


def test_prefix_first_limits(qwen):
    full = step(qwen, 32)
    whole = step(qwen, 32, verify_prefix=16)          # pass 1 is the block: no pass 2
    assert whole["pass2_s"] == 0.0 and whole["spec_tokens_per_s"] == pytest.approx(full["spec_tokens_per_s"], rel=1e-12)
    short = Acceptance.from_lengths([1, 2, 3, 4, 2], 16)   # no step accepts all 4 drafts of P = 4
    p4 = step(qwen, 32, short, verify_prefix=4)
    assert p4["pass2_request_share"] == 0.0 and p4["pass2_s"] == 0.0
    assert p4["verify_s"] == pytest.approx(step(qwen, 32, short, verify_len=4)["verify_s"], rel=1e-12)
    assert p4["tokens_per_step"] == pytest.approx(step(qwen, 32, short)["tokens_per_step"])
    long = Acceptance.from_lengths([16], 16)               # every request needs pass 2, every step
    both = step(qwen, 32, long, verify_prefix=4)
    target, drafter, feats = qwen
    rest = sum(step_seconds(target, drafter, feats, 32, 12, H100, "bf16", 512)["verify"].values())
    assert both["pass2_step_share"] == 1.0 and both["pass2_s"] == pytest.approx(rest, rel=1e-12)
    assert both["verify_rows"] == 32 * 16
    with pytest.raises(ValueError, match="not both"):
        step(qwen, 32, verify_prefix=4, verify_len=8)
    with pytest.raises(ValueError, match=r"verify_prefix 17 must be in 1\.\.16"):
        step(qwen, 32, verify_prefix=17)


def test_expected_rows_and_pass_two(qwen):
    s = step(qwen, 32, verify_prefix=4)
    q = TAU3.survival(5)
    assert s["pass2_request_share"] == pytest.approx(q)
    assert s["verify_rows"] == pytest.approx(32 * 4 + 32 * q * 12)
    assert s["pass2_step_share"] == pytest.approx(1 - (1 - q) ** 32)
    cut = step(qwen, 32, verify_len=6)
    assert cut["tokens_per_step"] == pytest.approx(32 * TAU3.mean(6)) and cut["verify_rows"] == 32 * 6
    best = best_verify_len(*qwen, 32, TAU3, H100, weights="bf16", context=512)
    assert all(best["spec_tokens_per_s"] >= step(qwen, 32, verify_len=n)["spec_tokens_per_s"] for n in range(1, 17))


def test_rows_flat_below_the_ridge_and_linear_past_it(qwen):
    target, drafter, feats = qwen

    def verify_linear(c):
        return step_seconds(target, drafter, feats, c, 16, H100, "bf16", 512)["verify"]["linear"]

    assert verify_linear(2) / verify_linear(1) < 1.01        # 16 -> 32 rows: the weights' bytes bind
    assert verify_linear(128) / verify_linear(64) == pytest.approx(2.0, rel=1e-3)   # 1024 -> 2048: compute
    ar = [step(qwen, c)["decode_s"] for c in (1, 8, 32)]
    assert ar[0] < ar[1] < ar[2] < 1.5 * ar[0]                 # AR: weights once, KV per request


def test_a_chunk_rides_free_below_the_ridge_and_costs_its_math_past_it(qwen):
    """Qwen3-8B on an H100 (ridge ~350 rows): AR's 8 rows + a 256-row chunk stay under the ridge, so the
    step's linears cost about the weights' bytes; 32 requests x 16 verify rows + 256 are past it, so the
    chunk adds its own flops; a chunk's LM head runs at its tiles' last rows only."""
    target, drafter, feats = qwen

    def linears(c, chunk):
        return step_seconds(target, drafter, feats, c, 16, H100, "bf16", 512, prefill_rows=chunk)

    plain, mixed = linears(8, 0), linears(8, 256)
    assert mixed["decode"]["linear"] / plain["decode"]["linear"] < 1.15
    assert mixed["draft"] == plain["draft"]                                # the drafter sees no prompt rows
    past = linears(32, 256)["verify"]["linear"] - linears(32, 0)["verify"]["linear"]
    gemm_flops = 2 * 256 * sum(n * k * count for _, _, n, k, count in target.gemms(1))
    assert past == pytest.approx(gemm_flops / H100.matmul_flops, rel=0.02)


def test_closed_loop(qwen):
    """No prompt rows: the decode steps' speedup; prompt rows lower it, more so at few new tokens and
    high concurrency, where chunk steps are most of spec's time; past its decode steps a run is
    prefill-bound (every step carries a chunk)."""
    target, drafter, feats = qwen
    tau = Acceptance.geometric(6.49, 16)

    def loop(c, new, prompt, **kw):
        return closed_loop(target, drafter, feats, c, tau, H100, new, prompt, weights="bf16", context=512, **kw)

    assert loop(8, 256, 0)["speedup_over_ar"] == pytest.approx(loop(8, 256, 0)["decode_only_speedup"])
    assert loop(8, 256, 0)["speedup_over_ar"] == pytest.approx(step(qwen, 8, tau)["speedup_over_ar"])
    short, long_ = loop(32, 256, 330), loop(32, 1024, 330)
    assert short["speedup_over_ar"] < long_["speedup_over_ar"] < long_["decode_only_speedup"]
    assert short["spec_prefill_share"] > long_["spec_prefill_share"] > 0
    assert loop(8, 256, 330)["speedup_over_ar"] > short["speedup_over_ar"]
    bound = loop(32, 64, 2000)                               # 250 chunk steps, 10 spec decode steps
    assert bound["chunk_steps"] > bound["spec_steps"] and bound["spec_prefill_share"] == pytest.approx(1.0)
    assert bound["spec_s"] == pytest.approx(bound["chunk_steps"] * bound["mixed_ms"]["spec"] / 1e3)
    with pytest.raises(ValueError, match="new_tokens >= 1"):
        loop(8, 0, 100)
    # chunk steps with their own verify length: their tokens count first, decode steps make the rest
    one = loop(16, 256, 330, verify_len=16)
    own = loop(16, 256, 330, verify_len=16, mixed_verify_len=12)
    mixed_tokens = 16 * tau.mean(12)
    assert own["spec_steps"] == pytest.approx(own["chunk_steps"] + (256 * 16 - own["chunk_steps"] * mixed_tokens)
                                              / (16 * tau.mean(16)))
    assert own["mixed_ms"]["spec"] < one["mixed_ms"]["spec"] and own["plain_ms"] == one["plain_ms"]
    assert loop(16, 256, 330, verify_len=16, mixed_verify_len=16)["spec_s"] == pytest.approx(one["spec_s"])


def test_cost_cli_concurrency(tmp_path, capsys, qwen):
    assert cli.main(["cost", "--target", "qwen3-8b", "--concurrency", "32", "--verify-prefix", "4", "--tau", "3",
                     "--weights", "bf16", "--context", "512"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("verify.pass2") for line in out) and "spec / AR" in "\n".join(out)
    data = json.loads(out[-1])
    assert data["step"]["policy"] == "prefix-first P=4" and data["full_block"]["policy"] == "full block"
    assert data["step"]["speedup_over_ar"] == pytest.approx(step(qwen, 32, verify_prefix=4)["speedup_over_ar"])
    trace = traces.save(traces.Trace("test", 8, [{"benchmark": None, "id": None,
                                                  "acceptance_lengths": [2, 8, 3, 1]}]), tmp_path / "tr.json")
    t, d = tiny_target(tmp_path / "t"), tiny_drafter(tmp_path / "d", block_size=8)
    assert cli.main(["cost", "--target", str(t), "--drafter", str(d), "--concurrency", "4", "--verify-len", "3",
                     "--trace", str(trace), "--card", "H200"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["step"]["acceptance"] == "trace tr.json (3 steps)" and data["step"]["verify_rows"] == 12
    assert data["step"]["tokens_per_step"] == pytest.approx(4 * (2 + 3 + 3) / 3)
    assert cli.main(["cost", "--target", str(t), "--concurrency", "4"]) == 2
    assert "needs --drafter" in capsys.readouterr().err
    assert cli.main(["cost", "--target", "qwen3-8b", "--concurrency", "4", "--batch", "2"]) == 2
    assert "give one" in capsys.readouterr().err
    assert cli.main(["cost", "--target", "qwen3-8b", "--concurrency", "4", "--card", "A100"]) == 2
    assert "--card 'A100'" in capsys.readouterr().err
    assert cli.main(["cost", "--target", str(t), "--verify-prefix", "4"]) == 2
    assert "--verify-prefix go with --concurrency" in capsys.readouterr().err
    assert cli.main(["cost", "--target", str(t), "--new-tokens", "256"]) == 2
    assert "--new-tokens go with --concurrency" in capsys.readouterr().err
    assert cli.main(["cost", "--target", "qwen3-8b", "--concurrency", "32", "--tau", "6.49", "--weights", "bf16",
                     "--context", "512", "--new-tokens", "256", "--prompt-tokens", "330"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("closed-loop spec / AR") for line in out)
    data = json.loads(out[-1])
    assert data["closed_loop"]["chunk_steps"] == pytest.approx(32 * 330 / 256)


def test_evaluator_models_the_batched_verify_policies(qwen):
    """The agents' cost-model evaluator gives the batched step model's numbers (same ceilings, same
    acceptance law) and so ranks prefix-first against full verify as the model does at each C; prefix-first
    replaces adaptive verify, as in BatchConfig."""
    ev = CostModelEvaluator(context=512, tau=3.0)
    known = by_name()
    assert ev.models(known["batch.verify_prefix"]) and ev.models(known["batch.adaptive_verify"])
    ranks = {}
    for c in (1, 8, 32, 64, 128):
        dep = Deployment("qwen3-8b", "dflash-b16", "H100", c, "bf16")
        for p in (0, 2, 3):
            est = ev(dep, {"run.weights": "bf16", "batch.verify_prefix": p, "batch.adaptive_verify": False}).tokens_per_s
            assert est == pytest.approx(step(qwen, c, verify_prefix=p)["spec_tokens_per_s"], rel=1e-9)
        ranks[c] = ev(dep, {"run.weights": "bf16", "batch.verify_prefix": 3}).tokens_per_s > \
            ev(dep, {"run.weights": "bf16", "batch.adaptive_verify": False}).tokens_per_s
    assert not ranks[1] and ranks[128]     # one request: pass 2 re-reads every weight; 2048 rows: compute
    c1 = Deployment("qwen3-8b", "dflash-b16", "H100", 1, "bf16")
    for dep in (c1, Deployment("qwen3-8b", "dflash-b16", "H100", 32, "bf16")):
        # graphed, choosing among the block's quarters, the block itself one of them: never below full verify
        full = ev(dep, {"batch.adaptive_verify": False}).tokens_per_s
        assert ev(dep, {}).tokens_per_s >= full * (1 - 1e-9)               # shipped: adaptive verify
    with pytest.raises(ValueError, match="below the block size 4"):
        ev(c1, {"batch.verify_prefix": 4, "run.block_size": 4})
    assert ev(c1, {"batch.verify_prefix": 2}).tokens_per_s == \
        ev(c1, {"batch.verify_prefix": 2, "batch.adaptive_verify": False}).tokens_per_s


def test_gap_ranking_sees_the_verify_policy():
    """A batched deployment's gap table charges spec.linear with what the best verify policy of the
    registry's candidates saves per token over the assignment's; one request has no such gap."""
    ev = CostModelEvaluator(context=512, tau=3.0)
    for c in (32, 128):
        dep = Deployment("qwen3-8b", "dflash-b16", "H100", c, "bf16")
        a = {"run.weights": "bf16", "batch.adaptive_verify": False}         # full verify
        policies = [{"batch.verify_prefix": p} for p in by_name()["batch.verify_prefix"].values] + \
            [{"batch.adaptive_verify": True}]
        best = min(ev.seconds_per_token(dep, {**a, **p}) for p in policies)
        gap = ev.gaps(dep, a)["spec.linear"]
        assert gap == pytest.approx(max(0.0, ev.seconds_per_token(dep, a) - best), rel=1e-9) and gap > 0
    c1 = Deployment("qwen3-8b", "dflash-b16", "H100", 1, "bf16")
    assert ev.gaps(c1, {"run.weights": "bf16"}).get("spec.linear", 0.0) == 0.0


def test_evaluator_mixes_adaptive_verifys_probe_steps():
    """Adaptive verify's probe steps (a share 1 / BatchConfig.adaptive_probe_every) are in its tokens and
    its verify time, at the length chosen with every draft past L surely accepted: longer than L where
    the drafts past L survive often enough to pay for the bound."""
    from specpilot.engine.batch.config import BatchConfig

    ev = CostModelEvaluator(context=512, tau=3.0)
    dep = Deployment("qwen3-8b", "dflash-b16", "H100", 64, "bf16")
    a = {"run.weights": "bf16", "batch.adaptive_verify": True}
    kind, length = ev._verify_policy(dep, a, 16)
    probe = ev._probe_len(dep, a, 16, length)
    assert kind == "adaptive" and length < probe <= 16            # 1024 rows: trimming pays, the bound looks past it
    assert ev._probe_len(dep, a, 16, 16) == length                 # no bound past the block: the plain choice
    share = 1 / BatchConfig().adaptive_probe_every
    acc = ev.acceptance(16)
    assert ev.tokens_per_step(dep, a) == pytest.approx(64 * ((1 - share) * acc.mean(length) + share * acc.mean(probe)))
    verify = {n: sum(ev.step_times(dep, a, policy=("len", n))["verify"].values()) for n in (length, probe)}
    mixed = sum(ev.step_times(dep, a)["verify"].values())
    assert mixed == pytest.approx((1 - share) * verify[length] + share * verify[probe], rel=1e-9)


def test_evaluator_runs_the_closed_loop_of_a_workload(qwen):
    """With a workload the evaluator's batched estimate is the closed-loop model's (chunk steps carry
    batch.prefill_chunk prompt rows), AR and spec alike; without one, or at one request, it stays at the
    decode steps. The chunk's size is not searched: the ceilings rank it against the engine's measurement."""
    target, drafter, feats = qwen
    ev = CostModelEvaluator(context=512, tau=3.0, workload=(330, 256))
    assert not ev.models(by_name()["batch.prefill_chunk"])
    for chunk in (128, 2048):
        a = {"run.weights": "bf16", "batch.adaptive_verify": False, "batch.prefill_chunk": chunk}
        loop = closed_loop(target, drafter, feats, 16, TAU3, H100, 256, 330, prefill_chunk=chunk, weights="bf16",
                           context=512)
        spec = ev(Deployment("qwen3-8b", "dflash-b16", "H100", 16, "bf16"), a).tokens_per_s
        ar = ev(Deployment("qwen3-8b", "none", "H100", 16, "bf16"), a).tokens_per_s
        assert spec == pytest.approx(16 * 256 / loop["spec_s"], rel=1e-9)
        assert ar == pytest.approx(16 * 256 / loop["ar_s"], rel=1e-9)
    steady = CostModelEvaluator(context=512, tau=3.0)
    for c in (1, 16):
        dep = Deployment("qwen3-8b", "dflash-b16", "H100", c, "bf16")
        same = ev(dep, {}).tokens_per_s == pytest.approx(steady(dep, {}).tokens_per_s, rel=1e-12)
        assert same == (c == 1)                      # one request: its decode steps; 16: slower with chunks
    with pytest.raises(ValueError, match="workload"):
        CostModelEvaluator(workload=(330, 0))
