"""The gates' own behaviour: honest variants pass on fresh shapes, each check rejects what it
must (with the same code the GPU runs), timing sanity checks reject impossible or hidden work."""
import os
import time

import pytest
import torch
from conftest import requires_gpu

from specpilot.agents.candidates import build_callable, gemv_candidate
from specpilot.agents.gate import Split12GemvGate, tamper_check
from specpilot.agents.gate_accept import check_chain_accept, reference_chain_accept
from specpilot.agents.timing import FakeTimer, Timing
from specpilot.kernels.variants.split12_gemv_cpu import make_cpu_gemv
from specpilot.kernels.variants.split12_gemv_cuda import GemvParams


@pytest.fixture
def seed():
    """A fresh seed per run (conftest's fresh_generator cannot carry its seed on this torch)."""
    return int.from_bytes(os.urandom(4), "little")


def _shape(seed):
    gen = torch.Generator().manual_seed(seed)
    return int(torch.randint(1, 160, (1,), generator=gen)), int(torch.randint(1, 400, (1,), generator=gen))


@pytest.mark.parametrize("params", [GemvParams(), GemvParams(32, 4, 2, 1), GemvParams(8, 16, 4, 2),
                                    GemvParams(256, 1, 1, 4)], ids=lambda p: p.label())
def test_honest_variants_pass_every_check(params, seed):
    shape = _shape(seed)
    gate = Split12GemvGate("cpu", timer=FakeTimer(lambda c, s: 1.0), copy_bandwidth=1e12)
    r = gate.run(make_cpu_gemv(params), shape)
    assert r.passed, f"seed {seed}, shape {shape}: {r.reason}"
    assert [v.check for v in r.verdicts][:5] == ["decode", "exact_arith", "tolerance", "held_out", "determinism"]


def _honest():
    return make_cpu_gemv(GemvParams(32, 4, 1, 1))


def test_faster_than_the_roofline_is_rejected_as_suspect():
    # 96 x 320 split12 bytes at 1 GB/s copy bandwidth take ~46 us; a 1 us claim is impossible
    gate = Split12GemvGate("cpu", timer=FakeTimer(lambda c, s: 1e-6), copy_bandwidth=1e9)
    r = gate.run(_honest(), (96, 320))
    assert not r.passed and r.verdicts[-1].check == "roofline" and "suspect" in r.reason


class _HiddenWorkTimer:
    label = "cuda-events"

    def measure(self, run, n_inputs, candidate=None, shape=None, hooks=None):
        for i in range(n_inputs):
            hooks.stage(i)
            run(i)
            hooks.collect(i)
        return Timing(2e-6, self.label, 1, {"synced_s": 60e-6, "sync_overhead_s": 5e-6})


def test_time_that_appears_only_after_a_full_sync_is_rejected():
    gate = Split12GemvGate("cpu", timer=_HiddenWorkTimer(), copy_bandwidth=1e12)
    r = gate.run(_honest(), (64, 64))
    assert not r.passed and "outside the timed stream" in r.reason


def test_unwritten_output_is_caught_by_the_nan_poison():
    r = Split12GemvGate("cpu").run(lambda *args: None, (40, 72))
    assert not r.passed and r.verdicts[0].check == "decode" and "not written" in r.reason


def test_nondeterministic_output_is_rejected():
    honest, last = _honest(), []

    def flaky(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad):
        honest(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad)
        if last and torch.equal(last[-1], x):  # a repeated input: flip the last bit of one output
            y.view(torch.int16)[0] ^= 1
        last.append(x.clone())
    r = Split12GemvGate("cpu").run(flaky, (48, 64))
    assert not r.passed and r.verdicts[-1].check == "determinism"


def test_modified_inputs_are_rejected():
    honest = _honest()

    def mutating(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad):
        honest(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad)
        lo.zero_()  # the next caller computes with zeroed weights
    gate = Split12GemvGate("cpu", timer=FakeTimer(lambda c, s: 1.0), copy_bandwidth=1e12)
    assert not gate.run(mutating, (32, 64)).passed


def test_tamper_check_restores_patched_clocks():
    original = time.perf_counter
    time.perf_counter = lambda: 0.0
    try:
        assert tamper_check() == ["time.perf_counter"]
    finally:
        time.perf_counter = original
    assert time.perf_counter is original and tamper_check() == []


def test_chain_accept_gate():
    assert check_chain_accept(reference_chain_accept).passed

    def one_too_many(draft, target):
        return (reference_chain_accept(draft, target) + 1).clamp(max=draft.shape[1])
    r = check_chain_accept(one_too_many)
    assert not r.passed and "accept more" in r.reason


def test_builtin_candidates_build_on_cpu(seed):
    shape = _shape(seed)
    c = gemv_candidate(shape, {"threads_per_row": 16, "rows_per_block": 2, "vec_groups": 4, "unroll": 1}, "builtin", "cpu")
    assert Split12GemvGate("cpu").run(build_callable(c), shape).passed


def test_work_hidden_on_a_thread_only_while_timed_is_rejected():
    # honest through the cascade (at most 11 calls), then the output is left to a thread: the
    # timed runs' outputs, as read back right after each run, are not there
    from specpilot.agents.exploits import cpu_honest_then_thread

    gate = Split12GemvGate("cpu", timer=FakeTimer(lambda c, s: 1.0, reps=4), copy_bandwidth=1e12)
    r = gate.run(cpu_honest_then_thread(None), (96, 320))
    assert not r.passed
    assert [v.check for v in r.verdicts if not v.passed] == ["timing"], r.reason
    time.sleep(0.1)  # let the daemon threads finish before the next test counts threads


def _gpu_exploit_fn(launcher):
    from specpilot.agents.candidates import Candidate
    from specpilot.agents.exploits import GEMV_PARAMS
    from specpilot.kernels.variants.split12_gemv_cuda import render

    cand = Candidate("split12_gemv", (1024, 1024), "cuda", "test", {**GEMV_PARAMS.to_dict(), "launcher": launcher},
                     render(GEMV_PARAMS), launcher)
    return build_callable(cand)


@requires_gpu
@pytest.mark.parametrize("launcher", ["side_stream", "side_stream_after_input"])
def test_gpu_work_off_the_callers_stream_is_rejected_before_timing(launcher, tmp_path, monkeypatch):
    pytest.importorskip("cupy")
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    from specpilot.agents.timing import CudaTimer

    gate = Split12GemvGate("cuda", timer=CudaTimer(reps=5))
    r = gate.run(_gpu_exploit_fn(launcher), (1024, 1024))
    # side_stream: its work runs while the caller's stream is held, on the NaN input (deterministic);
    # side_stream_after_input: the caller's read-back is queued first at a higher priority
    assert not r.passed and "stream" in r.reason, r.reason
    if launcher == "side_stream":
        assert r.verdicts[-1].check == "decode" and "stream_order" in r.reason, r.reason


@requires_gpu
def test_gpu_honest_launch_passes_with_pure_device_time(tmp_path, monkeypatch):
    pytest.importorskip("cupy")
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    from specpilot.agents.timing import CudaTimer

    timer = CudaTimer(reps=10)
    gate = Split12GemvGate("cuda", timer=timer, copy_bandwidth=timer.bandwidth)
    r = gate.run(_gpu_exploit_fn("default"), (4096, 4096))
    # the honest launcher is not mistaken for hidden work, and its device time (held to the measured
    # copy bandwidth by the roofline check) was taken with the stream held across the host's queueing
    assert r.passed, r.reason
    assert r.timing.label == "cuda-events" and r.timing.extra["hold_s"] > 0
