"""The spec step's bookkeeping kernels (csrc/cuda/spec_step.cu) against engine/step_kernels.py's torch
reference: the same integers (verify block, argmaxes, packed output, next control) for argmax ties,
NaN rows, odd vocab sizes, replay on and off, tail blocks and the max_length cap. Skipped on CPU;
on a GPU a build without the kernels fails."""
import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import fresh_seed
from specpilot.engine import step_kernels
from specpilot.engine.step_kernels import CONTROL

pytestmark = requires_gpu


@pytest.fixture(autouse=True)
def spec_step_ops(cuda_build):
    """On a GPU, a build without the spec_step kernels fails these tests (the cuda_build policy), never
    skips them."""
    if not step_kernels.available():
        pytest.fail("specpilot._C has no spec_step kernels (csrc/cuda/spec_step.cu): rebuild with SPECPILOT_CUDA=1")


def control(**values):
    return torch.tensor([values[name] for name in CONTROL], dtype=torch.long, device="cuda")


def logits_with_ties(rows, vocab, gen):
    x = torch.randn(rows, vocab, generator=gen, device="cuda").to(torch.bfloat16)
    top = x.float().max(dim=1).values
    x[0, vocab // 3] = x[0, 2 * vocab // 3] = top[0] + 1      # a tie: the first index must win
    x[-1, 5] = float("nan")                                    # NaN counts as the largest
    return x


def run_both(fn, *tensors):
    """fn(*tensors) with the kernels and with the reference, each on its own copies."""
    results = []
    for kernels in (True, False):
        copies = [t.clone() for t in tensors]
        fn(*copies, kernels=kernels)
        torch.cuda.synchronize()
        results.append(copies)
    return results


@pytest.mark.parametrize("vocab", [151936, 1001])
@pytest.mark.parametrize("replay", [0, 1])
@pytest.mark.parametrize("vs, max_length", [(16, 4096), (5, 4096), (16, 530)])
def test_kernels_equal_the_reference(vocab, replay, vs, max_length):
    b, start, steps = 16, 520, 40
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    ctl = control(start=start, ctx_start=514, ctx_count=6, vs=min(vs, max_length - start), anchor=77, replay=replay,
                  max_length=max_length, step=3)
    draft_logits = logits_with_ties(b - 1, vocab, gen)
    verify_logits = logits_with_ties(b, vocab, gen)
    replay_drafts = torch.randint(0, vocab, (steps, b - 1), generator=gen, device="cuda")
    replay_accepted = torch.randint(0, b, (steps,), generator=gen, device="cuda")
    block = torch.zeros(b, dtype=torch.long, device="cuda")

    picked = run_both(step_kernels.pick_drafts, draft_logits, ctl, replay_drafts, block)
    assert torch.equal(picked[0][3], picked[1][3])
    block = picked[0][3]
    if not replay:   # make some drafts match the verify argmax, so the accepted count is not 0
        argmax = verify_logits.float().nan_to_num(float("inf")).argmax(dim=1)
        block[1:8] = argmax[:7]
        block[8] = (argmax[7] + 1) % vocab                     # the first rejected draft
    posterior = torch.zeros(b, dtype=torch.long, device="cuda")
    out = torch.zeros(2 + 2 * b, dtype=torch.long, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    kernel, reference = run_both(step_kernels.accept_block, verify_logits, block, replay_accepted, ctl, posterior,
                                 out, counter)
    for name, k, r in zip(("control", "posterior", "out"), (kernel[3], kernel[4], kernel[5]),
                          (reference[3], reference[4], reference[5])):
        assert torch.equal(k, r), f"{name}: kernel {k.tolist()} != reference {r.tolist()}"
    assert kernel[6].item() == 0                               # the counter is left zeroed
    assert kernel[4][0].item() == vocab // 3                   # the first of two equal maxima
    assert kernel[4][-1].item() == 5                           # NaN wins
    if not replay and vs == 16 and max_length == 4096:
        assert kernel[5][0].item() == 7                        # matched


def test_kernel_refuses_a_wrong_control():
    logits = torch.zeros(3, 64, dtype=torch.bfloat16, device="cuda")
    block = torch.zeros(4, dtype=torch.long, device="cuda")
    bad = torch.zeros(5, dtype=torch.long, device="cuda")
    with pytest.raises(RuntimeError, match="control must have shape"):
        step_kernels.pick_drafts(logits, bad, torch.zeros(2, 3, dtype=torch.long, device="cuda"), block)
