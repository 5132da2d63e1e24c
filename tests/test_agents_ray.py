"""The Ray worker backend on a local Ray instance (CPU): candidates judged in Ray tasks, a hung one
cancelled and reported as a timeout, and a missing Ray is a clear error (no silent process pool)."""
import builtins

import pytest

from specpilot.agents.candidates import Candidate, gemv_candidate
from specpilot.agents.workers import RayPool, make_pool

ray = pytest.importorskip("ray", reason="the optional ray extra is not installed")


def test_ray_pool_judges_candidates_and_cancels_a_hung_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    hung = Candidate("split12_gemv", (32, 64), "python", "test", {},
                     "import time\n\ndef split12_gemv(*args):\n    while True:\n        time.sleep(1)\n", "hung_kernel")
    honest = [gemv_candidate((32, 64), {"threads_per_row": t, "rows_per_block": 1}, "builtin", "cpu") for t in (32, 64)]
    pool = make_pool(2, "cpu", timeout_s=60, backend="ray")
    assert isinstance(pool, RayPool)
    seen = []
    try:
        results = pool.run([{"candidate": c.to_dict(), "device": "cpu", "timer": {"kind": "fake"}} for c in honest],
                           on_result=lambda i, r: seen.append(i))
        for r in results:
            assert r["verdicts"] and all(v["passed"] for v in r["verdicts"]) and r["time_s"] > 0
        assert sorted(seen) == [0, 1]
        pool.timeout_s = 8
        (timed_out,) = pool.run([{"candidate": hung.to_dict(), "device": "cpu", "timer": {"kind": "fake"}}])
        assert timed_out["verdicts"][0]["check"] == "timeout" and not timed_out["verdicts"][0]["passed"]
    finally:
        pool.close()
    assert not ray.is_initialized()


def test_missing_ray_is_an_error_not_a_fallback(monkeypatch):
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(RuntimeError, match="--backend ray needs the ray package"):
        make_pool(1, "cpu", 10.0, backend="ray")
    with pytest.raises(ValueError, match="unknown worker backend 'threads'"):
        make_pool(1, "cpu", 10.0, backend="threads")
