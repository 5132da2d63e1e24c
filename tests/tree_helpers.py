"""Shared by the tree verification tests: a tiny random pair (fp32 CPU) and an oracle drafter whose
block distributions put the target's own next tokens at chosen ranks, so that trees accept paths
through siblings (a random drafter's drafts are almost never accepted)."""
import contextlib
import dataclasses

import torch

from specpilot.engine import Engine
from specpilot.models import load_drafter, load_target
from specpilot.models.random_ckpt import write_pair


class TinyPair:
    def __init__(self, folder, preset, seed, block_size=16):
        self.seed = seed
        target_dir, drafter_dir = write_pair(folder, preset, drafter_layers=2, block_size=block_size, seed=seed,
                                             layer_ids=[0, 1])
        self.target = load_target(target_dir, dtype=torch.float32)
        self.drafter = load_drafter(drafter_dir, self.target)
        self.engine = Engine(self.target, self.drafter, max_seq_len=512)
        self.vocab = self.target.config.vocab_size

    def random_prompt(self, length, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.target.eos_token_ids[0], (length,), generator=g).tolist()


@contextlib.contextmanager
def tree_budget(engine, budget):
    saved = engine.config
    engine.config = dataclasses.replace(saved, tree_budget=budget)
    try:
        yield engine
    finally:
        engine.config = saved


def rank_of(position: int) -> int:
    """Where the oracle ranks the true token at `position`: mostly first, every 4th second (a sibling
    finds it), every 7th nowhere near the top (no tree finds it)."""
    if position % 7 == 3:
        return 50
    return 1 if position % 4 == 1 else 0


def oracle_logits(start: int, depths: int, vocab: int, prompt_len: int, transcript) -> torch.Tensor:
    """[1, depths, V]: depth d ranks the target's own token at start + d as rank_of says, a fixed decoy
    above it when it is second, over noise that depends on `start` only (a padded block's first rows
    are a shorter block's)."""
    g = torch.Generator().manual_seed(start)
    logits = torch.randn(1, depths, vocab, generator=g)                     # noise in [-4, 4]
    for d in range(1, depths + 1):
        i = start + d - prompt_len
        true = transcript[i] if i < len(transcript) else 0
        decoy = (true + 1 + start % 5) % vocab
        rank = rank_of(start + d)
        logits[0, d - 1, true] = (20.0, 19.0)[rank] if rank < 2 else -20.0
        if rank == 1:
            logits[0, d - 1, decoy] = 20.0
    return logits


@contextlib.contextmanager
def oracle_drafts(engine, prompt_len, transcript):
    """The drafter's logits replaced by oracle_logits', in the stepwise loops (runner.draft_step) and in
    the fused steps (their draft forward: the CPU runs it eagerly, so the oracle reads the block's
    anchor position). Only the drafts change: outputs must not."""
    runner, vocab = engine.runner, engine.target.config.vocab_size
    original, forwards = runner.draft_step, runner.fused.forwards

    def draft_step(ctx_features, ctx_start, block_ids, start, full_block, visible=None):
        original(ctx_features, ctx_start, block_ids, start, full_block, visible)   # the drafter's caches as usual
        return oracle_logits(start, block_ids.shape[1] - 1, vocab, prompt_len, transcript)

    def draft_forward(block_ids, positions, kv_len, last_visible):
        forwards.draft(block_ids, positions, kv_len, last_visible)
        return oracle_logits(int(positions[0]), block_ids.shape[1] - 1, vocab, prompt_len, transcript)

    runner.draft_step, runner.fused.forwards = draft_step, dataclasses.replace(forwards, draft=draft_forward)
    try:
        yield engine
    finally:
        runner.draft_step, runner.fused.forwards = original, forwards
