"""`specpilot serve`: a client that goes away frees its engine request; shutdown finishes in-flight requests
within its grace period and cancels the rest, and logs so (fp32, CPU, tiny random pair)."""
import logging
import threading
import time

import httpx
import pytest

from serve_helpers import MODEL, client, start_server, tiny_pair_dirs
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)

LONG = 480            # tokens: a request that runs for a while on the CPU


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return tiny_pair_dirs(tmp_path_factory.mktemp("serve_lifecycle"), seed=7)


def _wait(cond, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _all_pages_free(server) -> bool:
    engine = server.served.worker.engine
    return server.served.worker.in_flight == 0 and engine.pool.free_pages == engine.pool.num_pages


def test_client_disconnects_free_their_requests(dirs):
    server = start_server(*dirs, max_model_len=512)
    worker = server.served.worker
    try:
        body = {"model": MODEL, "prompt": "long", "max_tokens": LONG, "temperature": 0}
        with httpx.stream("POST", server.url + "/completions", json={**body, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")            # the first chunk arrived; then hang up
        _wait(lambda: worker.outcomes["cancelled"] == 1 and _all_pages_free(server))
        with pytest.raises(httpx.ReadTimeout):                    # a non-streamed request, abandoned
            httpx.post(server.url + "/completions", json=body, timeout=0.3)
        _wait(lambda: worker.outcomes["cancelled"] == 2 and _all_pages_free(server))
        assert worker.outcomes["finished"] == 0
        tokens = server.served.metrics.generated_tokens
        assert tokens < 2 * LONG                                   # both stopped early
        after = client(server).completions.create(model=MODEL, prompt="ok", max_tokens=4, temperature=0)
        assert after.usage.completion_tokens >= 1
    finally:
        server.stop()


def test_shutdown_finishes_in_flight_requests_within_the_grace_period(dirs, caplog):
    caplog.set_level(logging.INFO, logger="specpilot.serve")
    server = start_server(*dirs, max_model_len=512, shutdown_grace_s=60)
    want = client(server).completions.create(model=MODEL, prompt="p", max_tokens=200, temperature=0).choices[0].text
    got = {}

    def ask():
        got["text"] = client(server).completions.create(model=MODEL, prompt="p", max_tokens=200,
                                                        temperature=0).choices[0].text

    asker = threading.Thread(target=ask)
    asker.start()
    _wait(lambda: server.served.worker.in_flight == 1)
    server.stop()
    asker.join(60)
    assert got.get("text") == want
    assert "shutdown: 1 request(s) in flight" in caplog.text
    assert "shutdown: 1 request(s) finished, 0 cancelled, 0 failed; engine stopped" in caplog.text
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/models", timeout=5)


def test_shutdown_cancels_what_outlives_the_grace_period(dirs, caplog):
    caplog.set_level(logging.INFO, logger="specpilot.serve")
    server = start_server(*dirs, max_model_len=512, shutdown_grace_s=0.3)
    seen = {"chunks": 0}

    def stream():
        try:
            s = client(server).completions.create(model=MODEL, prompt="p", max_tokens=LONG, temperature=0, stream=True)
            for _ in s:
                seen["chunks"] += 1
        except Exception as e:                 # the connection is cut at shutdown
            seen["error"] = type(e).__name__

    reader = threading.Thread(target=stream)
    reader.start()
    _wait(lambda: seen["chunks"] > 0)
    server.stop()
    reader.join(60)
    assert not reader.is_alive()
    assert "shutdown: 1 request(s) in flight" in caplog.text
    assert "shutdown: 0 request(s) finished, 1 cancelled, 0 failed; engine stopped" in caplog.text
    engine = server.served.worker.engine
    assert engine.pool.free_pages == engine.pool.num_pages and not engine.running and not engine.queue
    assert server.served.metrics.generated_tokens < LONG


def test_an_engine_failure_fails_in_flight_requests_and_health_says_so(dirs):
    server = start_server(*dirs, max_model_len=128)
    engine = server.served.worker.engine
    try:
        def broken_step():
            raise RuntimeError("planted: the device fell over")

        engine.step = broken_step
        r = httpx.post(server.url + "/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4}, timeout=30)
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "engine_failed" and "planted: the device fell over" in r.text
        health = httpx.get(server.url[:-len("/v1")] + "/health", timeout=10)
        assert health.status_code == 503 and "planted" in health.json()["reason"]
        again = httpx.post(server.url + "/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4}, timeout=30)
        assert again.status_code == 503 and again.json()["error"]["code"] == "unavailable"
    finally:
        server.stop()
