"""bench/batch_profile.py's chunk modes: every step carries a prefill chunk beside the same decode rows
(else the `+chunk` rows would time decode-only steps under another name), and the newcomers leave."""
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.bench.batch_profile import build, engine_at


def test_every_step_carries_a_chunk_beside_the_decode_rows():
    target, drafter = build("tiny-qwen3", torch.device("cpu"), torch.float32, drafter_layers=1, block=4)
    concurrency, steps, context = 2, 7, 300                  # a newcomer takes two chunks of 256 rows
    engine = engine_at(target, drafter, concurrency, context, steps, newcomers=True)
    before, left = engine.prefill_steps, []
    for _ in range(steps):
        left += engine.step()
        assert sum(s.decoding for s in engine.running) == concurrency
    assert engine.prefill_steps - before == steps
    assert [len(r.tokens) for r in left] == [1] * (steps // 2) and all(r.error is None for r in left)
