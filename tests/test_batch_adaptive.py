"""The adaptive verify length's parts: the budget and allocation, the online logistic, the cost table."""
import numpy as np
import pytest
import torch

from test_engine_helpers import fresh_seed
from specpilot.engine.batch.adaptive import (AcceptanceEstimator, StepCostTable, choose_verify_rows, survival_matrix,
                                             top2_margin, verify_row_choices)


def s(*values):
    return torch.tensor(values, dtype=torch.float64)


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


def test_survivals_are_cumulative_products_zero_past_the_drafts():
    est = AcceptanceEstimator(3)
    est.w, est.b = [1.0, 0.0, 2.0], [0.0, 1.0, -1.0]
    surv = survival_matrix(est, [torch.tensor([0.0, 1.0, 0.5]), torch.tensor([2.0])])
    p = 1 / (1 + np.exp(-np.array([0.0, 1.0, 0.0])))
    assert np.allclose(surv[0], np.cumprod(p)) and np.allclose(surv[1], [1 / (1 + np.exp(-2.0)), 0, 0])
    assert torch.allclose(est.probs(s(0.0, 1.0, 0.5)), torch.tensor(p, dtype=torch.float64))


def test_estimator_learns_the_margin_slope():
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    est = AcceptanceEstimator(2)
    for _ in range(3000):
        m = torch.rand(2, generator=g) * 6
        p = torch.sigmoid(1.5 * m - 3)
        accepted = 0
        while accepted < 2 and torch.rand(1, generator=g).item() < p[accepted].item():
            accepted += 1
        est.observe(m.tolist(), admitted=2, accepted=accepted)
    est.refit()
    assert abs(est.w[0] - 1.5) < 0.3 and abs(est.b[0] + 3) < 0.6, f"seed {seed}: {est.w}, {est.b}"
    assert abs(est.w[1] - 1.5) < 0.5, f"seed {seed}: position 2 sees only rows whose first draft was accepted"
    probs = est.probs(s(0.0, 6.0))
    assert probs[0] < 0.2 and probs[1] > 0.9


def test_estimator_refuses_a_negative_slope_and_censors_labels():
    est = AcceptanceEstimator(1)
    for i in range(200):
        est.observe([float(i % 5)], admitted=1, accepted=int(i % 5 == 0))   # larger margin, fewer accepted
    est.refit()
    assert (est.w[0], est.b[0]) == (0.0, 1.5)
    est2 = AcceptanceEstimator(3)
    est2.observe([1.0, 2.0, 3.0], admitted=3, accepted=1)     # draft 2 rejected: draft 3 unobserved
    est2.observe([1.0, 2.0, 3.0], admitted=1, accepted=1)     # only draft 1 verified
    assert [len(est2.observations(k)[0]) for k in range(3)] == [2, 1, 0]
    assert est2.observations(1)[1][0] == 0.0


def test_top2_margin_and_cost_table():
    assert torch.equal(top2_margin(torch.tensor([[1.0, 4.0, 2.0], [0.0, 0.0, -1.0]])), torch.tensor([2.0, 0.0]))
    table = StepCostTable([(16, 2.0), (64, 3.0)], fixed_s=0.5)
    assert [table.cost(n) for n in (1, 16, 17, 64, 128)] == [2.5, 2.5, 3.5, 3.5, 6.5]
    with pytest.raises(ValueError, match="step-cost table needs"):
        StepCostTable([(0, 1.0)])


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
