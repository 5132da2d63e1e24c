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
from specpilot.agents.timing import FakeTimer
from specpilot.timing import CpuTimer
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
    assert [v.check for v in r.verdicts] == ["decode", "exact_arith", "tolerance", "held_out", "exact_large_k", "determinism",
                                             "stateless", "side_effects", "timing", "side_effects_after_timing", "roofline"]


def _honest():
    return make_cpu_gemv(GemvParams(32, 4, 1, 1))


def test_real_cpu_time_beyond_the_roofline_is_rejected_as_suspect():
    # the real CPU timer, held to an absurd 1 kB/s copy bandwidth: any real time is "too fast"
    gate = Split12GemvGate("cpu", timer=CpuTimer(reps=3), copy_bandwidth=1e3)
    r = gate.run(_honest(), (96, 320))
    assert not r.passed and r.verdicts[-1].check == "roofline" and "suspect" in r.reason, r.reason
    assert r.timing.label == "cpu-wall" and r.timing.seconds > 0 and len(r.timing.samples) == 3


def test_honest_variant_passes_with_the_real_cpu_timer_and_measured_bandwidth():
    from specpilot.cost import measure_ceilings

    bandwidth = measure_ceilings("cpu", quick=True).copy_bandwidth
    r = Split12GemvGate("cpu", timer=CpuTimer(reps=3), copy_bandwidth=bandwidth).run(_honest(), (96, 320))
    assert r.passed, r.reason
    assert [v.check for v in r.verdicts][-3:] == ["timing", "side_effects_after_timing", "roofline"]


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


def test_modified_weight_planes_are_rejected_by_the_input_check():
    honest = _honest()

    def mutating(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad):
        honest(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad)
        lo.zero_()  # its own output is right; the next caller computes with zeroed weights
    gate = Split12GemvGate("cpu", timer=FakeTimer(lambda c, s: 1.0), copy_bandwidth=1e12)
    r = gate.run(mutating, (32, 64))
    assert not r.passed and r.verdicts[-1].check == "inputs" and "'lo'" in r.reason, r.reason


def test_input_written_only_while_timed_is_rejected_by_the_input_check():
    import inspect

    honest = _honest()

    def sneaky(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad):
        honest(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad)
        if any(f.function == "measure" for f in inspect.stack()[1:4]):
            x[0] = 0.0
    gate = Split12GemvGate("cpu", timer=CpuTimer(reps=2), copy_bandwidth=1e12)
    r = gate.run(sneaky, (32, 64))
    assert not r.passed and r.verdicts[-1].check == "inputs" and "while timed" in r.reason, r.reason


def test_tamper_check_restores_patched_clocks():
    import specpilot.timing as package_timing

    original, bound = time.perf_counter, package_timing.perf_counter
    time.perf_counter = lambda: 0.0
    package_timing.perf_counter = lambda: 0.0
    try:
        assert sorted(tamper_check()) == ["specpilot.timing.perf_counter", "time.perf_counter"]
    finally:
        time.perf_counter, package_timing.perf_counter = original, bound
    assert time.perf_counter is original and package_timing.perf_counter is bound and tamper_check() == []


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


def test_timed_calls_use_inputs_never_seen_before_into_shuffled_outputs():
    seen_inputs, outputs = [], []
    honest = _honest()

    def recorder(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad):
        seen_inputs.append(x.clone())
        outputs.append(y.data_ptr())
        honest(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad)
    gate = Split12GemvGate("cpu", timer=CpuTimer(reps=12, warmup=2), copy_bandwidth=1e12)
    r = gate.run(recorder, (48, 96))
    assert r.passed, r.reason
    timed = seen_inputs[-14:]
    earlier = seen_inputs[:-14]
    keys = [bytes(t.view(torch.int16).numpy()) for t in seen_inputs]
    assert len(set(keys[-14:])) == 14 and not set(keys[-14:]) & set(keys[:-14]), "a timed input repeated"
    assert len(earlier) > 0 and len(timed) == 14
    assert len(set(outputs[-14:])) > 1, "every timed call wrote into the same output buffer"


@requires_gpu
def test_gpu_honest_launch_passes_with_pure_device_time(tmp_path, monkeypatch):
    pytest.importorskip("cupy")
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    from specpilot.timing import CudaTimer

    timer = CudaTimer(reps=10)
    gate = Split12GemvGate("cuda", timer=timer, copy_bandwidth=timer.bandwidth)
    from specpilot.kernels.variants.split12_gemv_cuda import NAIVE_PARAMS

    r = gate.run(build_callable(gemv_candidate((4096, 4096), NAIVE_PARAMS.to_dict(), "test", "cuda")), (4096, 4096))
    # the honest launcher is not mistaken for hidden work, and its device time (held to the measured
    # copy bandwidth by the roofline check) was taken with the stream held across the host's queueing
    assert r.passed, r.reason
    assert r.timing.label == "cuda-events" and r.timing.extra["hold_s"] > 0
