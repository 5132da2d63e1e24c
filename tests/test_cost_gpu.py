"""The cost model's GPU timing: graph replays (the host's dispatch not counted), an fn that cannot be
captured timed eagerly, and weights cycled past the L2 so that a linear streams from HBM. Skipped on CPU."""
import time

import torch

from conftest import requires_gpu

pytestmark = requires_gpu


def test_time_call_counts_the_device_not_the_host():
    from specpilot.cost.timer import time_call

    x = torch.zeros(1, device="cuda")
    slow_host = lambda: (time.sleep(0.002), x.add_(1))       # 2 ms of host work around a ~us kernel
    t = time_call(slow_host, "cuda", reps=5)
    assert 0 < t < 1e-4, f"{t * 1e6:.1f} us: the host's sleep was timed"


def test_time_call_times_an_uncapturable_fn_eagerly():
    from specpilot.cost.timer import time_call

    x = torch.ones(1 << 20, device="cuda")
    t = time_call(lambda: x.sum().item(), "cuda", reps=3)     # .item() syncs: not allowed in a capture
    assert t > 0
    assert time_call(lambda: x.mul_(1), "cuda", reps=3) > 0   # capture still works afterwards


def test_a_linear_that_fits_in_l2_is_timed_from_hbm():
    from specpilot.cost.ceilings import measure_ceilings
    from specpilot.cost.gaps import _Measurer

    meas = _Measurer("cuda", "bf16", reps=10)
    n = k = 4096                                               # 32 MiB: fits an H100 / H200 L2 (50 MiB)
    nbytes = n * k * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert meas.copies(nbytes) * nbytes >= 2 * l2 and meas.copies(10 * l2) == 1
    floor = nbytes / measure_ceilings("cuda").copy_bandwidth
    t = meas.linear(1, n, k)
    assert t >= 0.9 * floor, f"{t * 1e6:.1f} us against a {floor * 1e6:.1f} us HBM floor: served from L2"


def test_the_cost_models_untimed_kernel_counts_match_the_engines_graphs():
    """Per layer, the engine's graphed AR / verify / draft steps launch the kernels the cost model times
    as components plus cost/shapes.UNTIMED_KERNELS: a change to the engine's fusions must update both."""
    from specpilot.bench.kernel_counts import TIMED_PER_LAYER, counts
    from specpilot.cost.shapes import UNTIMED_KERNELS

    for weights in ("bf16", "split12"):
        for step, (per_layer, _, names) in counts(weights).items():
            expected = TIMED_PER_LAYER[step] + UNTIMED_KERNELS[("decode" if step == "ar" else step, weights)][0]
            assert per_layer == expected, f"{weights} {step}: {per_layer} kernels per layer, the model has {expected}: {names}"
