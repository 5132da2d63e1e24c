"""Shared fixtures for the engine / models / verify tests: tiny random pairs in fp32 on the CPU,
written with our random_ckpt and loaded both by us and by HF / dflash (stock)."""
import contextlib
import dataclasses
import os
import random

import pytest
import torch

from specpilot.engine import Engine
from specpilot.models import load_drafter, load_target
from specpilot.models.random_ckpt import write_pair
from specpilot.verify.stock import load_stock


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread():
    """Our tiny models run fastest single-threaded, and on a busy 2-core machine a second OpenMP thread
    makes each small matmul ~20x slower (spin-waiting); restored after each module."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# SPECPILOT_TEST_SEEDS=N: every fresh_seed call draws from one generator seeded N, so a whole run repeats
# (CI sets it); each call still gets a seed of its own.
_SEEDS = random.Random(int(os.environ["SPECPILOT_TEST_SEEDS"])) if os.environ.get("SPECPILOT_TEST_SEEDS") else None


def fresh_seed() -> int:
    """A new seed per call: random, or the next of SPECPILOT_TEST_SEEDS's sequence; SPECPILOT_TEST_SEED
    to replay a failure (every call returns it). Printed, so that a failing test's captured output
    names it."""
    if os.environ.get("SPECPILOT_TEST_SEED"):
        seed = int(os.environ["SPECPILOT_TEST_SEED"])
        if not 0 <= seed < 2**31:       # the range fresh seeds come from, which tests count on
            raise ValueError(f"SPECPILOT_TEST_SEED={seed} must be in [0, 2**31)")
    elif _SEEDS is not None:
        seed = _SEEDS.randrange(2**31)
    else:
        seed = int.from_bytes(os.urandom(4), "little") % (2**31)
    print(f"fresh_seed: {seed} (SPECPILOT_TEST_SEED={seed} replays it)")
    return seed


class Pair:
    """Our target/drafter/engine and stock's HF target/drafter for one random checkpoint pair."""

    def __init__(self, folder, preset, layer_ids, block_size, seed, max_shard_bytes=None):
        self.seed = seed
        self.target_dir, self.drafter_dir = write_pair(folder, preset, drafter_layers=2, block_size=block_size,
                                                       seed=seed, layer_ids=layer_ids,
                                                       max_shard_bytes=max_shard_bytes)
        self.target = load_target(self.target_dir, dtype=torch.float32)
        self.drafter = load_drafter(self.drafter_dir, self.target)
        self.engine = Engine(self.target, self.drafter, max_seq_len=512)
        self.stock = load_stock(self.target_dir, self.drafter_dir, "cpu", torch.float32)
        self.eos = self.target.eos_token_ids[0]

    def random_prompt(self, length):
        g = torch.Generator().manual_seed(fresh_seed())
        return torch.randint(0, self.eos, (length,), generator=g).tolist()


@contextlib.contextmanager
def loop_config(engine, **changes):
    """The engine's loop choices (EngineConfig fields read by its loops: fused_steps, early_launch)
    changed within the block."""
    saved = engine.config
    engine.config = dataclasses.replace(saved, **changes)
    try:
        yield engine
    finally:
        engine.config = saved
