"""The greedy accept / commit rule (engine/accept.py), and the fused step's bookkeeping (the torch
reference in engine/step_kernels.py and, on a GPU, csrc/cuda/spec_step.cu) held to it."""
import random

import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import fresh_seed
from specpilot.engine import accept, step_kernels
from specpilot.engine.step_kernels import CONTROL


def longest_prefix(drafts, posterior, real):
    """The rule in words: count drafts from the first while each equals the target's token before it."""
    n = 0
    while n < real and drafts[n] == posterior[n]:
        n += 1
    return n


def test_accepted_prefix_is_the_longest_matching_prefix():
    rng = random.Random(fresh_seed())
    for _ in range(300):
        b = rng.randint(2, 16)
        posterior = [rng.randint(0, 3) for _ in range(b)]
        drafts = [p if rng.random() < 0.7 else rng.randint(0, 3) for p in posterior[:-1]]
        real = rng.randint(0, b - 1)
        got = accept.accepted_prefix(torch.tensor(drafts), torch.tensor(posterior), real)
        assert int(got) == longest_prefix(drafts, posterior, real)
        got = accept.accepted_prefix(torch.tensor(drafts), torch.tensor(posterior), torch.tensor([real]))
        assert int(got) == longest_prefix(drafts, posterior, real)
        anchor = rng.randint(0, 3)                  # the host form, over a whole block [anchor, drafts]
        assert accept.matched_drafts([anchor] + drafts, posterior) == longest_prefix(drafts, posterior, b - 1)


def test_new_tokens_are_the_accepted_drafts_and_the_bonus():
    block, posterior = [9, 1, 2, 3, 4], [1, 2, 7, 8, 5]
    assert accept.new_tokens(block, posterior, 2) == [1, 2, 7]
    assert accept.new_tokens(block, posterior, 0) == [1]
    assert accept.new_tokens(block, posterior, 4) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("new, room, stop, produced, stopped, tokens", [
    ([1, 2, 3], 5, set(), 3, False, [1, 2, 3]),          # all of it fits
    ([1, 2, 3], 2, set(), 2, False, [1, 2]),             # the tail room cuts it
    ([1, 2, 3], 5, {2}, 2, True, [1, 2]),                # cut after the stop token, which is kept
    ([1, 2, 3], 1, {2}, 1, False, [1]),                  # the stop token lies past the room
    ([4], 1, {4}, 1, True, [4]),
])
def test_commit_cuts_at_room_and_after_the_first_stop(new, room, stop, produced, stopped, tokens):
    out = [0]
    assert accept.commit(new, room, stop, out) == (produced, stopped)
    assert out == [0] + tokens


def host_step(block, posterior, c: dict, replay_accepted: int):
    """The fused step's expected packed output and next control (a dict by CONTROL name), from the
    host rule alone."""
    matched = longest_prefix(block[1:], posterior, c["vs"] - 1)
    acc = replay_accepted if c["replay"] else matched
    new = accept.new_tokens(block, posterior, acc)
    produced = min(len(new), c["max_length"] - c["start"] - 1)
    after = c["start"] + produced
    nxt = dict(c, start=after, ctx_start=c["start"], ctx_count=produced, vs=min(c["max_length"] - after, len(block)),
               anchor=new[produced - 1], step=c["step"] + 1)
    return [matched, *block, *posterior, c["start"]], [nxt[name] for name in CONTROL]


def check_fused_step_against_the_rule(device, vocab, replay, vs, max_length):
    """Runs step_kernels.accept_block (the CUDA kernel where it applies, else the torch reference)."""
    gen = torch.Generator().manual_seed(fresh_seed())
    b, start, steps = 16, 520, 40
    c = {"start": start, "ctx_start": 514, "ctx_count": 6, "vs": min(vs, max_length - start), "anchor": 77,
         "replay": replay, "max_length": max_length, "step": 3}
    logits = torch.randn(b, vocab, generator=gen).to(torch.bfloat16)
    posterior = logits.float().argmax(dim=1)
    block = torch.randint(0, vocab, (b,), generator=gen)
    block[1:8] = posterior[:7]                              # seven drafts the target accepts
    block[8] = (posterior[7] + 1) % vocab                   # then the first rejected one
    replay_accepted = torch.randint(0, b, (steps,), generator=gen)
    want_out, want_control = host_step(block.tolist(), posterior.tolist(), c, int(replay_accepted[c["step"]]))

    control = torch.tensor([c[name] for name in CONTROL], device=device)
    out = torch.zeros(2 + 2 * b, dtype=torch.long, device=device)
    got_posterior = torch.zeros(b, dtype=torch.long, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    step_kernels.accept_block(logits.to(device), block.to(device), replay_accepted.to(device), control,
                              got_posterior, out, counter)
    assert got_posterior.tolist() == posterior.tolist()
    assert out.tolist() == want_out
    assert control.tolist() == want_control
    if not replay and c["vs"] == 16:
        assert want_out[0] == 7                             # the case exercises a partial acceptance


CASES = [(vocab, replay, vs, max_length) for vocab in (1001, 4096) for replay in (0, 1)
         for vs, max_length in ((16, 4096), (5, 4096), (16, 530))]


@pytest.mark.parametrize("vocab, replay, vs, max_length", CASES)
def test_torch_reference_follows_the_rule(vocab, replay, vs, max_length):
    check_fused_step_against_the_rule("cpu", vocab, replay, vs, max_length)


@requires_gpu
@pytest.mark.skipif(not step_kernels.available(), reason="this build has no spec_step kernels")
@pytest.mark.parametrize("vocab, replay, vs, max_length", CASES + [(151936, 0, 16, 4096)])
def test_cuda_step_kernel_follows_the_rule(vocab, replay, vs, max_length):
    check_fused_step_against_the_rule("cuda", vocab, replay, vs, max_length)
