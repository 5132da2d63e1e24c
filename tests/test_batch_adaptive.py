"""The adaptive verify length's parts: the budget and allocation, the online logistic, the cost table."""
import pytest
import torch

from test_engine_helpers import fresh_seed
from specpilot.engine.batch.adaptive import AcceptanceEstimator, StepCostTable, top2_margin, verify_lengths


def s(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_flat_cost_verifies_everything_and_steep_cost_nothing():
    survivals = [s(0.9, 0.5, 0.1), s(0.3, 0.2)]
    assert verify_lengths(survivals, StepCostTable([(64, 1.0)])) == [4, 3]         # flat: every slot pays
    steep = StepCostTable([(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)])                 # cost ~ rows
    assert verify_lengths(survivals, steep) == [1, 1]                               # any draft lowers the rate


def test_budget_takes_best_slots_as_per_request_prefixes():
    # Flat to 6 rows: the 3 best slots ride free; a 7th row costs 7/6 and its 0.95 does not pay for it.
    survivals = [s(0.99, 0.98, 0.2), s(0.97, 0.1), s(0.95)]
    lengths = verify_lengths(survivals, StepCostTable.roofline(6))
    assert lengths == [3, 2, 1]
    for n, surv in zip(lengths, survivals):                  # admitted = the n - 1 most likely, a prefix
        assert all(surv[k] >= surv[j] for k in range(n - 1) for j in range(n - 1, len(surv)))


def test_ties_break_by_position_then_request():
    survivals = [s(0.5, 0.5), s(0.5, 0.5)]
    costs = StepCostTable([(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 1.5), (6, 10.0)])
    assert verify_lengths(survivals, costs) == [2, 2]      # 4 rows at 1.0 beat 5 rows at 1.5


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
    assert [len(o) for o in est2.obs] == [2, 1, 0]
    assert est2.obs[1][0][1] == 0.0


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
