"""A bounded load test of `specpilot serve`: 200 requests from 32 concurrent `openai` clients (completions
and chat, streamed and not) against a server batching at most 16: none lost or failed, each answer equal
to offline `specpilot generate`'s for its prompt, p50 / p99 latency printed (fp32, CPU, tiny random pair)."""
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serve_helpers import MODEL, client, offline_texts, start_server, streamed_text, tiny_pair_dirs
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)

REQUESTS, CLIENTS, NEW = 200, 32, 10
ROWS = ([{"id": f"p{i}", "prompt": f"def f{i}(x):\n    return x * {i}"} for i in range(20)]
        + [{"id": f"c{i}", "turns": [f"question number {i}?"]} for i in range(10)])


@pytest.mark.slow
def test_200_requests_from_32_clients_none_lost_each_equal_offline(tmp_path):
    tdir, ddir = tiny_pair_dirs(tmp_path / "pair", seed=21)
    want = offline_texts(tdir, ddir, ROWS, NEW, tmp_path)
    server = start_server(tdir, ddir, max_batch=16, max_model_len=128)
    c = client(server)

    def one(i):
        row, stream = ROWS[i % len(ROWS)], (i // len(ROWS)) % 2 == 1
        t0 = time.perf_counter()
        if "turns" in row:
            kw = dict(model=MODEL, messages=[{"role": "user", "content": row["turns"][0]}], max_tokens=NEW,
                      temperature=0)
            if stream:
                text = streamed_text(c.chat.completions.create(stream=True, **kw), "chat")[0]
            else:
                text = c.chat.completions.create(**kw).choices[0].message.content
        else:
            kw = dict(model=MODEL, prompt=row["prompt"], max_tokens=NEW, temperature=0)
            if stream:
                text = streamed_text(c.completions.create(stream=True, **kw), "completions")[0]
            else:
                text = c.completions.create(**kw).choices[0].text
        return i, text, time.perf_counter() - t0

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            done = list(pool.map(one, range(REQUESTS)))
    finally:
        server.stop()
    wall = time.perf_counter() - t0
    latencies = np.array([s for _, _, s in done])
    print(f"\nload: {REQUESTS} requests, {CLIENTS} clients, {wall:.1f} s; latency p50 "
          f"{np.percentile(latencies, 50) * 1e3:.0f} ms, p99 {np.percentile(latencies, 99) * 1e3:.0f} ms")
    assert sorted(i for i, _, _ in done) == list(range(REQUESTS))
    wrong = [(i, ROWS[i % len(ROWS)]["id"]) for i, text, _ in done if text != want[i % len(ROWS)]]
    assert not wrong, f"{len(wrong)} answers differ from offline generate: {wrong[:5]}"
    outcomes = server.served.worker.outcomes
    assert outcomes == {"finished": REQUESTS, "cancelled": 0, "failed": 0}
    assert wall < 120
