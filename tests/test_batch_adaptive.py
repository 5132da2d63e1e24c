"""The adaptive verify length's parts: the step's choice, the pooled acceptance estimate, the cost table."""
import numpy as np
import pytest

from test_engine_helpers import fresh_seed
from specpilot.engine.batch.adaptive import (HALF_LIFE_STEPS, PRIOR_MEAN, PRIOR_STRENGTH, AcceptanceEstimator,
                                             StepCostTable, choose_step_rows, choose_verify_rows, survival_matrix,
                                             verify_row_choices)


def test_row_choices_are_the_block_quarters():
    assert verify_row_choices(16) == (4, 8, 12, 16)
    assert verify_row_choices(8) == (2, 4, 6, 8)
    assert verify_row_choices(7)[-1] == 7 and verify_row_choices(2) == (1, 2)


def test_flat_cost_verifies_everything_and_steep_cost_the_least():
    survivals = np.array([[0.9, 0.5, 0.1, 0.05, 0.0, 0.0, 0.0], [0.3, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0]])
    assert choose_verify_rows(survivals, 2, (2, 4, 8), StepCostTable([(64, 1.0)])) == 8    # flat: every row pays
    steep = StepCostTable([(n, float(n)) for n in range(1, 17)])                          # cost ~ rows
    assert choose_verify_rows(survivals, 2, (2, 4, 8), steep) == 2


def test_rate_counts_each_request_up_to_its_own_drafts_and_padded_rows():
    # Two requests, T = 2 gives 2 + 0.9 + 0.8 = 3.7 tokens, T = 4 gives 2 + 1.7 + 1.4 + 0.5 = 5.6.
    survivals = np.array([[0.9, 0.8, 0.7], [0.8, 0.6, 0.0]])
    cheap_long = StepCostTable([(8, 1.0), (16, 1.4)])          # 4 padded requests: 8 or 16 rows
    assert choose_verify_rows(survivals, 4, (2, 4), cheap_long) == 4       # 5.6 / 1.4 > 3.7 / 1.0
    dear_long = StepCostTable([(8, 1.0), (16, 1.6)])
    assert choose_verify_rows(survivals, 4, (2, 4), dear_long) == 2        # 3.7 / 1.0 > 5.6 / 1.6
    # The draft's fixed cost makes longer verifies pay: (3.7 / 2.0 < 5.6 / 2.6).
    assert choose_verify_rows(survivals, 4, (2, 4), StepCostTable([(8, 1.0), (16, 1.6)], fixed_s=1.0)) == 4


def test_a_chunk_step_prices_its_prompt_rows_with_the_verify_rows():
    # flat to 256 rows, then compute-bound: 16 requests verify whole blocks alone, but beside a chunk
    # of 256 prompt rows the longer prefixes cost compute: 8 rows (5.0 tokens a request / 1.5) beat
    # 16 (6.5 / 2.0)
    survivals = np.cumprod(np.full((16, 15), 0.86), axis=1)
    table = StepCostTable([(64, 1.0), (128, 1.0), (256, 1.0), (384, 1.5), (512, 2.0), (768, 3.0)])
    assert choose_verify_rows(survivals, 16, (4, 8, 12, 16), table) == 16
    assert choose_verify_rows(survivals, 16, (4, 8, 12, 16), table, prefill_rows=256) == 8


def test_survivals_are_the_pooled_curve_zero_past_each_requests_drafts():
    est = AcceptanceEstimator(3)
    est.observe(3, 3)
    est.observe(3, 1)
    est.end_step()
    surv = survival_matrix(est, [3, 1, 0])
    assert np.allclose(surv[0], np.cumprod(est.rates)) and np.allclose(surv[1], [est.rates[0], 0, 0])
    assert not surv[2].any() and survival_matrix(est, []).shape == (0, 0)
    with pytest.raises(ValueError, match="drafted 4 tokens"):
        survival_matrix(est, [4])


def test_prior_before_labels_and_the_chain_for_unlabelled_positions():
    est = AcceptanceEstimator(4)
    assert np.allclose(est.rates, PRIOR_MEAN)                      # no label yet: whole blocks verified
    for _ in range(5):                                            # only draft 1 verified, mostly rejected
        for i in range(8):
            est.observe(1, int(i == 0))
        est.end_step()
    assert est.rates[0] < 0.35
    # positions 2..4 have no label: each borrows its predecessor's rate
    assert np.allclose(est.rates[1:], est.rates[0]) and np.all(est.at_risk[1:] == 0)


def test_labels_are_censored_at_the_first_rejection_and_the_verified_prefix():
    est = AcceptanceEstimator(4, half_life_steps=1e9)             # no discounting: exact counts
    est.observe(4, 1)     # draft 1 accepted, draft 2 rejected, 3 and 4 unobserved
    est.observe(2, 2)     # drafts 1 and 2 verified and accepted, 3 and 4 not verified
    est.observe(4, 4)
    est.observe(4, 0)
    est.end_step()
    assert np.allclose(est.at_risk, [4, 3, 1, 1]) and np.allclose(est.accepted, [3, 2, 1, 1])
    with pytest.raises(ValueError, match="accepted"):
        est.observe(2, 3)
    with pytest.raises(ValueError, match="positions"):
        est.observe(5, 0)


def _planted_step(rates, g, admitted_rows: int) -> int:
    """Accepted drafts of one request under conditional rates `rates`, verifying admitted_rows drafts."""
    accepted = 0
    while accepted < admitted_rows and g.random() < rates[accepted]:
        accepted += 1
    return accepted


def test_rates_converge_on_a_planted_law_under_their_own_trimming():
    """The engine's loop on the host: each step's T from the estimate so far (choose_step_rows, a cost
    table that makes trimming pay, a probe every 16th step), labels from a planted conditional law. The
    rates end within a few standard errors (of their own discounted counts) of the planted ones, the
    survival curve too, and the choice trims once the law says so."""
    seed = fresh_seed()
    g = np.random.default_rng(seed)
    planted = np.array([0.95, 0.9, 0.85, 0.8, 0.5, 0.3, 0.2])
    est = AcceptanceEstimator(len(planted))
    costs = StepCostTable([(16 * t, 1.0 + 0.08 * t) for t in (2, 4, 6, 8)])
    chosen = []
    for step in range(600):
        t = choose_step_rows(est, [7] * 16, 16, (2, 4, 6, 8), costs, probe=step % 16 == 0)
        chosen.append(t)
        for _ in range(16):
            est.observe(t - 1, _planted_step(planted, g, t - 1))
        est.end_step()
    tolerance = 5 * np.sqrt(planted * (1 - planted) / est.at_risk) + PRIOR_STRENGTH / est.at_risk
    assert np.all(np.abs(est.rates - planted) < tolerance), f"seed {seed}: {est.rates} vs {planted} +- {tolerance}"
    # the survival is the rates' product, so it is as close as their errors add up (|prod a - prod b| <=
    # sum |a_k - b_k| for factors in [0, 1]); a fixed 0.05 failed where trimming leaves late positions few labels
    bound = np.cumsum(tolerance)
    assert np.all(np.abs(est.survival - np.cumprod(planted)) < bound), f"seed {seed}: {est.survival} +- {bound}"
    best = choose_verify_rows(np.cumprod(planted)[None].repeat(16, 0), 16, (2, 4, 6, 8), costs)
    last = [t for step, t in enumerate(chosen) if step % 16][-15:]            # the probe steps left out
    assert best < 8 and last == [best] * 15, f"seed {seed}: the planted law's best T {best}, chose {last}"


def test_trimming_starts_within_a_few_steps_and_follows_a_change_of_law():
    seed = fresh_seed()
    g = np.random.default_rng(seed)
    est = AcceptanceEstimator(15)
    costs = StepCostTable([(32 * t, 1.0 + 0.03 * t) for t in (4, 8, 12, 16)])
    choose = lambda probe=False: choose_step_rows(est, [15] * 32, 32, (4, 8, 12, 16), costs, probe)  # noqa: E731
    assert choose() == 16                           # the optimistic prior: whole blocks first
    low = np.full(15, 0.4)
    first_trim = None
    for step in range(40):
        t = choose()
        first_trim = step if first_trim is None and t < 16 else first_trim
        for _ in range(32):
            est.observe(t - 1, _planted_step(low, g, t - 1))
        est.end_step()
    assert first_trim is not None and first_trim <= 2, f"seed {seed}: first trimmed step {first_trim}"
    assert choose() == 4
    high = np.full(15, 0.97)                        # the running mix changes: the rates follow it
    for step in range(6 * HALF_LIFE_STEPS):
        t = choose(probe=step % 16 == 0)
        for _ in range(32):
            est.observe(t - 1, _planted_step(high, g, t - 1))
        est.end_step()
    assert abs(est.rates[0] - 0.97) < 0.03 and choose() == 16, f"seed {seed}: {est.rates}"


def test_a_probe_step_looks_past_t_only_where_the_drafts_could_pay():
    """On a probe step the choice is remade with every draft past the first T surely accepted: it
    verifies further when a surviving prefix leaves that bound worth its cost, and stays at T when the
    estimate is sure the prefix is rejected (nothing past it can be accepted)."""
    costs = StepCostTable([(32 * t, 1.0 + 0.05 * t) for t in (4, 8, 12, 16)])
    choices = (4, 8, 12, 16)
    doubtful = AcceptanceEstimator(15, half_life_steps=1e9)       # draft 3 accepted half the time, 4.. unknown
    sure_reject = AcceptanceEstimator(15, half_life_steps=1e9)    # draft 3 never accepted
    for est, third in ((doubtful, 0.5), (sure_reject, 0.0)):
        for i in range(2000):
            est.observe(3, 2 + int(i < third * 2000))
        est.end_step()
    assert choose_step_rows(doubtful, [15] * 32, 32, choices, costs) == 4
    assert choose_step_rows(doubtful, [15] * 32, 32, choices, costs, probe=True) == 16
    assert choose_step_rows(sure_reject, [15] * 32, 32, choices, costs) == 4
    assert choose_step_rows(sure_reject, [15] * 32, 32, choices, costs, probe=True) == 4
    bound = survival_matrix(doubtful, [15, 2], sure_after=3)
    assert np.allclose(bound[0, 3:], doubtful.survival[2]) and np.allclose(bound[1], [*doubtful.survival[:2], *[0] * 13])


def test_bad_estimator_arguments():
    with pytest.raises(ValueError, match="positions=0"):
        AcceptanceEstimator(0)
    with pytest.raises(ValueError, match="prior_mean"):
        AcceptanceEstimator(3, prior_mean=1.5)


def test_cost_table():
    table = StepCostTable([(16, 2.0), (64, 3.0)], fixed_s=0.5)
    assert [table.cost(n) for n in (1, 16, 17, 64, 128)] == [2.5, 2.5, 3.5, 3.5, 6.5]
    with pytest.raises(ValueError, match="step-cost table needs"):
        StepCostTable([(0, 1.0)])


def test_cost_table_learns_the_host_share_of_a_step():
    """observe_step folds what a step's wall time leaves unexplained by the forwards into host_s, so
    the choice weighs a shorter verify against the whole step: a table whose device costs grow with
    the rows (T* = 2 alone) stops trimming once the host's share is known to dwarf them."""
    table = StepCostTable([(8, 1e-3), (16, 2e-3)], fixed_s=0.5e-3)
    survivals = np.array([[0.9, 0.8, 0.7], [0.8, 0.6, 0.0]])
    assert table.host_s == 0.0 and choose_verify_rows(survivals, 4, (2, 4), table) == 2
    for _ in range(60):
        table.observe_step(20.5e-3, 16)                       # each step 20.5 ms, its forwards 2.5 ms
    assert table.host_s == pytest.approx(18e-3, rel=0.01)
    assert table.cost(16) == pytest.approx(20.5e-3, rel=0.01) and table.device_cost(16) == 2.5e-3
    assert choose_verify_rows(survivals, 4, (2, 4), table) == 4
    table.observe_step(1e-3, 16)                              # a step faster than its forwards adds nothing
    assert table.host_s < 18e-3


def test_engine_teaches_its_measured_table_the_host_share():
    """A BatchEngine given a measured table (microseconds: far below a CPU step) learns the host's share
    from its decode steps and verifies whole blocks after the first steps; the roofline (no units)
    learns nothing."""
    from batch_helpers import EAGER_ADAPTIVE, five_requests, run_staggered, tiny_pair
    from specpilot.engine.batch import BatchEngine

    target, drafter = tiny_pair(10, 4, 3)
    steep = StepCostTable([(n, n * 1e-6) for n in range(1, 17)])    # rows cost: alone, T* = 1
    learnt = BatchEngine(target, drafter, EAGER_ADAPTIVE, max_batch=3, kv_pages=64, step_costs=steep)
    run_staggered(learnt, five_requests(10, 3))
    assert learnt.costs.host_s > 1e-4 and learnt.verify_rows > 0.8 * learnt.block_rows
    for given in (None, StepCostTable.roofline(6)):
        roofline = BatchEngine(target, drafter, EAGER_ADAPTIVE, max_batch=3, kv_pages=64, step_costs=given)
        run_staggered(roofline, five_requests(10, 3))
        assert roofline.costs.host_s == 0.0


def test_measured_cost_table_and_pages_returned():
    from batch_helpers import tiny_pair
    from specpilot.engine.batch import BatchConfig, BatchEngine
    from specpilot.engine.batch.profile import measure_step_costs

    target, drafter = tiny_pair(10, 4, 3)
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=4, kv_pages=40)
    table = measure_step_costs(engine, buckets=(16, 32, 4096), context=48, repeats=1)
    assert table.tokens == [16, 32] and all(t > 0 for t in table.seconds)      # 4096 rows do not fit: skipped
    assert engine.pool.free_pages == 40
    with pytest.raises(ValueError, match="no bucket"):
        measure_step_costs(engine, buckets=(4096,), context=48)


def test_graphed_cost_table_times_every_bucket_and_choice():
    """With graphs (StaticShapeStep on the CPU), the table has a point per request bucket x verify
    choice, the draft's time as its fixed part, and every page back in the pool."""
    from batch_helpers import tiny_pair
    from specpilot.engine.batch import BatchConfig, BatchEngine
    from specpilot.engine.batch.profile import measure_step_costs
    from specpilot.engine.graphs import StaticShapeStep

    target, drafter = tiny_pair(10, 4, 3)
    engine = BatchEngine(target, drafter, BatchConfig(adaptive_verify=True), max_batch=4, kv_pages=40,
                         graph_step_factory=StaticShapeStep)
    table = measure_step_costs(engine, context=40, repeats=1)
    # buckets 1, 2, 4 x rows 1..4: every product of the two
    assert table.tokens == sorted({r * t for r in (1, 2, 4) for t in (1, 2, 3, 4)})
    assert table.fixed_s > 0 and all(s > 0 for s in table.seconds)
    assert engine.pool.free_pages == 40
