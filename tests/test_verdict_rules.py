"""verify/verdict.py, spec_checks.py and referee.py by hand: the excuse rules at their edges, the cap,
the agreement sign test, the precision check, the forks of our speculative output, referee placement."""
import math

import pytest
import torch
from conftest import requires_gpu

from specpilot.verify import referee as referee_mod
from specpilot.verify.spec_checks import first_fork, spec_disagreements
from specpilot.verify.verdict import (AgreementTally, Rule, disagreement, distinct_contexts, excuse_cap, judge,
                                      noise_and_imprecise, sign_test_p, ulp)


def record(margin, top=1.0, **fields):
    return {"prompt": 0, "context": "stock", "position": 0, "margin": margin, "top": top, **fields}


def test_ulp_of_the_run_dtype():
    assert ulp(8.5, torch.bfloat16) == 0.0625 and ulp(-8.5, torch.bfloat16) == 0.0625
    assert ulp(1.0, torch.float32) == 2.0 ** -23 and ulp(0.75, torch.float16) == 2.0 ** -11


def test_referee_rule_excuses_strictly_below_k_noise():
    rule = Rule("fp32", torch.bfloat16, noise=0.02)
    assert rule.threshold(record(0.0)) == pytest.approx(0.08)
    excused, failed = judge([record(0.079), record(0.08), record(0.5), record(math.inf)], rule)
    assert [i["margin"] for i in excused] == [0.079] and len(failed) == 3
    assert all("threshold" in i and "excused" in i for i in excused + failed)
    with pytest.raises(ValueError, match="noise"):
        Rule("fp64", torch.float32, noise=None)
    with pytest.raises(ValueError, match="noise"):
        Rule("fp32", torch.bfloat16, noise=float("nan"))


def test_the_referee_rule_never_asks_for_less_than_one_ulp_of_the_run_dtype():
    """Two logits under one bf16 ulp apart can round to one value (argmax then goes by token index):
    the zoo hybrid pair's HumanEval/11 token 13, margin 0.0589 at 8.65 (ulp 0.0625), noise 0.0113."""
    rule = Rule("fp32", torch.bfloat16, noise=0.0113)
    assert rule.threshold(record(0.0, top=8.65)) == 0.0625 and rule.threshold(record(0.0, top=1.0)) == pytest.approx(0.0452)
    excused, failed = judge([record(0.0589, top=8.65), record(0.0625, top=8.65), record(0.0589, top=3.0)], rule)
    assert [i["margin"] for i in excused] == [0.0589] and [(i["margin"], i["top"]) for i in failed] == [(0.0625, 8.65), (0.0589, 3.0)]
    assert Rule("fp64", torch.float32, noise=1e-7).threshold(record(0.0, top=10.0)) == 2.0 ** -20   # ~1e-6: exact


def test_a_disagreement_where_ours_is_the_referees_choice_is_the_other_sides():
    """The reference (stock's transcript) left the referee's argmax by far more than the noise, ours kept
    it: not our mismatch. The referee choosing the other token fails us, so does our own AR output
    leaving it (both sides of spec-vs-ar are ours), and the fallback scorer (stock's own model) never
    sides with us this way."""
    rule = Rule("fp32", torch.bfloat16, noise=0.01)
    ours_right = record(0.075, check="forced", ours=719, other=678, referee_choice=719)
    spec_right = record(0.075, check="spec-vs-stock", ours=719, other=678, referee_choice=719)
    ours_wrong = record(0.059, check="forced", ours=678, other=719, referee_choice=719)
    neither = record(0.5, check="forced", ours=1, other=2, referee_choice=3)
    our_ar_wrong = record(0.075, check="spec-vs-ar", ours=719, other=678, referee_choice=719)
    excused, failed = judge([ours_right, spec_right, ours_wrong, neither, our_ar_wrong], rule)
    assert excused == [ours_right, spec_right] and failed == [ours_wrong, neither, our_ar_wrong]
    assert "referee's choice" in rule.describe()
    fallback = Rule("none", torch.bfloat16)
    assert judge([record(0.5, top=8.5, check="forced", ours=719, other=678, referee_choice=719)], fallback)[0] == []


def test_ulp_fallback_excuses_two_ulps_of_the_larger_logit():
    rule = Rule("none", torch.bfloat16)
    excused, failed = judge([record(0.125, top=8.5), record(0.1875, top=8.5), record(0.125, top=3.0)], rule)
    assert [(i["margin"], i["top"]) for i in excused] == [(0.125, 8.5)] and len(failed) == 2
    assert "ulp fallback" in rule.describe()
    fp32 = Rule("none", torch.float32)
    assert fp32.threshold(record(0.0, top=10.0)) == 2 * 2.0 ** -20            # about 2e-6: effectively exact


def test_disagreement_scores_both_tokens_with_the_referee():
    scores = torch.tensor([0.5, 2.0, 1.75, -3.0], dtype=torch.float64)
    item = disagreement(scores, 2, 1, prompt="p", check="forced")
    assert item["margin"] == 0.25 and item["top"] == 2.0 and item["referee_choice"] == 1 and item["prompt"] == "p"


def test_excuse_cap_and_distinct_contexts():
    assert [excuse_cap(n) for n in (0, 32, 199, 256, 3072)] == [1, 1, 1, 2, 30]
    # where stock itself leaves the referee's argmax: (paths + 1) x its flips may be excused, no more
    assert excuse_cap(256, stock_flips=19) == 38
    assert excuse_cap(256, stock_flips=19, paths=3) == 76
    assert excuse_cap(3072, stock_flips=3, paths=3) == 30
    with pytest.raises(ValueError, match="paths=0"):
        excuse_cap(256, 3, paths=0)
    same = [record(0.0, path=p, position=4) for p in ("prefill", "decode", "verify")]
    spec = [record(0.0, position=4, context="spec"), {**record(0.0, position=4), "prompt": 1}]
    assert distinct_contexts(same) == 1 and distinct_contexts(same + spec) == 3


def test_sign_test_and_agreement():
    assert sign_test_p(0, 0) == 1.0 and sign_test_p(3, 0) == 0.125 and sign_test_p(10, 0) == 2.0 ** -10
    assert sign_test_p(2, 2) == pytest.approx(11 / 16)
    tally = AgreementTally()
    ref = torch.arange(20)
    stock = ref.clone()
    tally.add("close", torch.where(ref < 3, -1, ref), stock, ref)      # loses 3 of stock's: p = 1/8
    tally.add("worse", torch.where(ref < 10, -1, ref), stock, ref)     # loses 10: p < 1e-3
    better = stock.clone()
    better[:5] = -1                                                     # stock misses 5, ours none
    tally.add("better", ref, better, ref)
    out = tally.summary()
    assert out["close"]["ok"] and out["close"]["only_stock"] == 3 and out["close"]["ours_agree"] == 17
    assert not out["worse"]["ok"] and out["worse"]["p"] < 1e-3
    assert out["better"]["ok"] and out["better"]["only_ours"] == 5 and out["better"]["stock_agree"] == 15


def test_precision_check_keeps_a_lossy_path_out_of_the_noise():
    error = {"stock": {"rms_error": 0.02}, "prefill": {"rms_error": 0.021, "typical_ratio": 1.1},
             "decode": {"rms_error": 0.05, "typical_ratio": 2.5}}
    noise, imprecise = noise_and_imprecise(error)
    assert noise == 0.021 and imprecise == {"decode": 2.5}
    # a precise path whose RMS a few positions inflate widens the noise by at most PRECISION_FACTOR
    error = {"stock": {"rms_error": 0.02}, "verify": {"rms_error": 0.09, "typical_ratio": 0.9}}
    assert noise_and_imprecise(error) == (pytest.approx(0.04), {})
    assert noise_and_imprecise({"stock": {"rms_error": 0.0}, "verify": {"rms_error": 0.0, "typical_ratio": 1.0}}) \
        == (0.0, {})


def test_typical_ratio_is_the_median_of_per_position_ratios():
    """One sensitive position rules both RMS errors; the typical ratio sees the other positions."""
    from specpilot.verify.arbiter_error import ArbiterErrorTally

    reference = torch.zeros(5, 4, dtype=torch.float64)
    stock_err = torch.tensor([1.0, 1.0, 1.0, 1.0, 100.0])
    tally = ArbiterErrorTally()
    tally.add("stock", reference + stock_err[:, None], reference)
    tally.add("honest", reference + torch.tensor([0.8, 1.2, 0.9, 1.1, 250.0])[:, None], reference)
    tally.add("lossy", reference + 2.5 * stock_err[:, None], reference)
    tally.add("exact", reference, reference)
    out = tally.summary()
    assert out["honest"]["rms_error"] / out["stock"]["rms_error"] > 2.4       # the RMS ratio alone would fail it
    assert out["honest"]["typical_ratio"] == pytest.approx(1.1)            # median of 0.8, 0.9, 1.1, 1.2, 2.5
    assert out["lossy"]["typical_ratio"] == pytest.approx(2.5) and out["exact"]["typical_ratio"] == 0.0
    assert "typical_ratio" not in out["stock"]
    noise, imprecise = noise_and_imprecise(out)
    assert imprecise == {"lossy": pytest.approx(2.5)} and noise == pytest.approx(2 * out["stock"]["rms_error"])
    tally.add("short", reference[:2], reference[:2])
    with pytest.raises(ValueError, match="short: 2 positions vs stock's 5"):
        tally.summary()


def test_forks_of_our_speculative_output():
    assert first_fork([1, 2, 3], [1, 2, 3]) is None
    assert first_fork([1, 5, 3], [1, 2, 3]) == 1 and first_fork([1, 2], [1, 2, 3]) == 2
    vocab = 8
    scores = torch.zeros(4, vocab, dtype=torch.float64)
    scores[2, 5], scores[2, 3] = 1.0, 1.0 - 1e-7          # the fork: a near-tie, ours on top
    scores[3, 6], scores[3, 7] = 2.0, 2.5                 # past it: the referee prefers 7 to our 6
    calls = []
    items, fork_stock, fork_ar = spec_disagreements("p", [1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 5, 6],
                                                    lambda: calls.append(1) or scores)
    assert (fork_stock, fork_ar, len(calls)) == (2, None, 1)
    assert [(i["check"], i["position"], i["context"]) for i in items] == [("spec-vs-stock", 2, "stock"),
                                                                         ("spec-transcript", 3, "spec")]
    assert items[0]["margin"] == pytest.approx(1e-7) and items[1]["margin"] == 0.5
    assert items[1]["other"] == 7 and items[1]["referee_choice"] == 7
    # identical outputs: nothing scored; a length difference: a record no rule can excuse
    assert spec_disagreements("p", [1, 2], [1, 2], [1, 2], lambda: calls.append(1)) == ([], None, None)
    items, _, fork_ar = spec_disagreements("p", [1, 2, 3], [1, 2, 3], [1, 2], lambda: scores)
    assert fork_ar == 2 and items[0]["margin"] == math.inf and "lengths differ" in items[0]["note"]


def test_referee_kind_and_placement(monkeypatch):
    assert referee_mod.referee_kind(torch.bfloat16) == "fp32" and referee_mod.referee_kind(torch.float16) == "fp32"
    assert referee_mod.referee_kind(torch.float32) == "fp64"
    with pytest.raises(ValueError, match="float64"):
        referee_mod.referee_kind(torch.float64)
    monkeypatch.setattr(referee_mod, "_host_available_bytes", lambda: 10 << 30)
    assert referee_mod.place(1 << 30, "cpu") == "cpu"
    assert referee_mod.place(100 << 30, "cpu") is None
    if torch.cuda.is_available():
        assert referee_mod.place(100 << 30, "cpu", "cuda") == "cuda"      # asked for: no second guess
    else:
        with pytest.raises(ValueError, match="no CUDA GPU"):
            referee_mod.place(1, "cpu", "cuda")
    assert referee_mod.place(100 << 30, "cpu", "cpu") == "cpu"
    with pytest.raises(ValueError, match="'gpu'"):
        referee_mod.place(1, "cpu", "gpu")
    with pytest.raises(ValueError, match="'fp16'"):
        referee_mod.load_referee("unused", torch.float32, choice="fp16")
    none = referee_mod.load_referee("unused", torch.float32, choice="none")
    assert none.kind == "none" and none.model is None and "--referee none" in none.note


def test_a_referee_that_fits_nowhere_falls_back_and_says_so(tmp_path, monkeypatch):
    from specpilot.models.random_ckpt import write_pair

    target_dir, _ = write_pair(tmp_path, "tiny-llama", layer_ids=[1, 2], block_size=4, seed=1)
    monkeypatch.setattr(referee_mod, "_host_available_bytes", lambda: 0)
    fallback = referee_mod.load_referee(target_dir, torch.float32, "cpu")
    assert fallback.kind == "none" and "fits neither" in fallback.note and "ulp fallback" in fallback.note
    monkeypatch.undo()
    real = referee_mod.load_referee(target_dir, torch.float32, "cpu")
    assert real.kind == "fp64" and next(real.model.parameters()).dtype == torch.float64


@requires_gpu
def test_referee_goes_on_the_gpu_when_it_fits_and_scores_as_on_the_host(tmp_path):
    from specpilot.models.random_ckpt import write_pair

    target_dir, _ = write_pair(tmp_path, "tiny-llama", layer_ids=[1, 2], block_size=4, seed=2)
    gpu = referee_mod.load_referee(target_dir, torch.bfloat16, "cuda")
    host = referee_mod.load_referee(target_dir, torch.bfloat16, "cuda", device="cpu")
    assert (gpu.kind, gpu.device, host.device) == ("fp32", "cuda", "cpu") and "on cuda" in gpu.note
    sequence = list(range(3, 40))
    on_gpu, on_host = (referee_mod.scored_logits(r.model, sequence, 8) for r in (gpu, host))
    assert on_gpu.device.type == "cpu" and on_gpu.dtype == torch.float32 and on_gpu.shape == on_host.shape
    # fp32 on two devices: the same sums in other orders, ~1e-6 of logits of a few units
    torch.testing.assert_close(on_gpu, on_host, rtol=0, atol=1e-4)


def test_stock_flips_count_where_stock_leaves_the_referee():
    tally = AgreementTally()
    assert tally.stock_flips() == 0
    ref = torch.arange(10)
    stock = ref.clone()
    stock[[2, 7]] = -1
    tally.add("prefill", ref, stock, ref)
    tally.add("decode", ref, stock, ref)     # the same positions again: still two flips of stock's
    assert tally.stock_flips() == 2
