"""Tiny random target + drafter pairs of the new kinds (DFlash2, DSpark, PARD) for CPU fp32 tests.

Random drafters rarely guess a random target's tokens, so a test of acceptance would see only
acceptance lengths of 1. `accepting_pair` therefore writes pairs with a two-token LM head
(random_kinds.write_kind_pair's two_token_head: about half the drafts accepted), from consecutive
seeds until one accepts at least two drafts in a step on a probe prompt (bounded tries): the checks
then exercise multi-token acceptance and the drafters' state updates after it.
"""
import torch

from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.models import load_drafter, load_target
from specpilot.models.drafters.random_kinds import write_kind_pair

PROBE = [5, 9, 2, 7, 11, 3]


class KindPair:
    def __init__(self, folder, kind, seed, block_size=8, preset="tiny-qwen3", **options):
        self.kind, self.seed = kind, seed
        self.target_dir, self.drafter_dir = write_kind_pair(folder, kind, preset, drafter_layers=2,
                                                            block_size=block_size, seed=seed, layer_ids=[0, 2],
                                                            **options)
        self.target = load_target(self.target_dir, dtype=torch.float32)
        self.drafter = load_drafter(self.drafter_dir, self.target)
        self.engine = Engine(self.target, self.drafter, max_seq_len=512)

    def longest_acceptance(self) -> int:
        return max(self.engine.generate_spec(PROBE, 23).acceptance_lengths)

    def prompts(self, block_size, length):
        """A random prompt, and the probe too at the drafter's own block (where the pair was seen to
        accept two drafts, so a check of acceptance lengths over these prompts sees one)."""
        return ([PROBE] if block_size == self.drafter.block_size else []) + [self.prompt(length)]

    def prompt(self, length):
        """Random prompt tokens (below the byte tokenizer's specials)."""
        return torch.randint(0, 318, (length,), generator=torch.Generator().manual_seed(fresh_seed())).tolist()


def accepting_pair(folder_factory, kind, tries: int = 12, preset="tiny-llama", accepts=None, **options) -> KindPair:
    """The first pair of consecutive seeds that `accepts` (default: >= 2 drafts accepted in one step
    on the probe prompt). tiny-llama by default: its untied head with two hot rows gives mixed 0 / 1
    outputs (tied tiny-qwen3 settles on one repeated token)."""
    accepts = accepts or (lambda pair: pair.longest_acceptance() >= 3)
    base = fresh_seed()
    for i in range(tries):
        pair = KindPair(folder_factory(), kind, base + i, preset=preset, two_token_head=True, **options)
        if accepts(pair):
            print(f"{kind} pair: seed {pair.seed} accepts >= 2 drafts")
            return pair
    raise AssertionError(f"no {kind} pair of seeds {base}..{base + tries - 1} accepted two drafts")
