"""bench/traces.py: fixed-tau traces, JSON round trip, replay steps."""
import json
import os
import random
import statistics

import pytest

from specpilot.bench import traces


@pytest.fixture
def rng():
    """Fresh inputs every run; the seed is printed so a failure can be reproduced."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return random.Random(seed)


def test_fixed_tau_mean_and_values(rng):
    bs = rng.randint(2, 16)
    tau = rng.uniform(1.0, bs)
    n = rng.randint(50, 500)
    t = traces.fixed_tau(tau, bs, n)
    seq = t.prompts[0]["acceptance_lengths"]
    assert len(seq) == n
    assert set(seq) <= {int(tau), int(tau) + 1} and all(1 <= a <= bs for a in seq)
    for k in (1, n // 2, n):  # every prefix mean is within 1/k of tau
        assert abs(statistics.mean(seq[:k]) - tau) <= 1.0 / k + 1e-12
    assert "fixed tau" in t.describe()
    with pytest.raises(ValueError, match="tau must be in"):
        traces.fixed_tau(bs + 0.5, bs)


def test_round_trip_and_steps_for(tmp_path, rng):
    bs = 16
    prompts = [{"benchmark": "humaneval", "id": f"h/{i}",
                "acceptance_lengths": [rng.randint(1, bs) for _ in range(rng.randint(1, 20))]}
               for i in range(rng.randint(1, 5))]
    t = traces.Trace(source="stock on zoo", block_size=bs, prompts=prompts)
    back = traces.load(traces.save(t, tmp_path / "t.json"), block_size=bs)
    assert back.prompts == prompts and back.block_size == bs
    assert back.tau == pytest.approx(statistics.mean(statistics.mean(p["acceptance_lengths"]) for p in prompts))
    i = rng.randrange(10)
    need = rng.randint(1, 300)
    steps = back.steps_for(i, need)
    seq = prompts[i % len(prompts)]["acceptance_lengths"]
    assert sum(steps) >= need and steps[:len(seq)] == seq
    assert "stock on zoo" in back.describe()


def test_from_rows_keeps_one_method():
    rows = [{"benchmark": "b", "sample_id": "b/0", "turn": 0, "method": "stock", "acceptance_lengths": [2, 3]},
            {"benchmark": "b", "sample_id": "b/0", "turn": 0, "method": "our_spec", "acceptance_lengths": [4]},
            {"benchmark": "b", "sample_id": "b/1", "turn": 0, "method": "stock", "acceptance_lengths": []}]
    t = traces.from_rows(rows, "stock", "src", 16)
    assert [p["acceptance_lengths"] for p in t.prompts] == [[2, 3]]


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        traces.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": traces.FORMAT, "source": "s", "block_size": 4,
                               "prompts": [{"acceptance_lengths": [1, 5]}]}))
    with pytest.raises(ValueError, match=r"ints in 1\.\.4, got \[5\]"):
        traces.load(bad)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"format": traces.FORMAT, "source": "s", "block_size": 16, "prompts": []}))
    with pytest.raises(ValueError, match="larger than the run's 8"):
        traces.load(big, block_size=8)
    assert traces.parse_replay("6.49", 16).tau == pytest.approx(6.49, abs=1e-3)
    flat = tmp_path / "flat.json"
    flat.write_text("[1, 2, 3]")
    assert traces.parse_replay(str(flat), 16).prompts[0]["acceptance_lengths"] == [1, 2, 3]
