"""The reference for hybrid recurrent targets: the target's own greedy AR, transformers' `generate`.

Stock `dflash_generate` is no reference there: after a partial acceptance it crops its DynamicCache,
which rolls KV back but cannot take rejected tokens out of a Gated DeltaNet layer's recurrent state,
so its output leaves the target's greedy output (tests/test_hybrid_engine.py; the zoo README:
after 4-11 tokens on each of 6 HumanEval prompts). A lossless loop must emit exactly the target's
greedy sequence, so `token_force` forces against that instead, with the same verdict rules.
"""
from __future__ import annotations

import time

import torch

from .stock import StockPair, StockResult

STOCK = "stock dflash_generate"
TARGET_GREEDY = ("the target's own greedy AR (transformers generate): stock dflash_generate is not lossless on "
                 "hybrid recurrent targets (its cache crop cannot restore recurrent state)")


# Drafter kinds with no installable stock: their reference loops play stock's part (verify/stock.py load).
REFERENCE_LOOPS = {"dspark": "the DSpark reference loop (verify/dspark_reference.py, after DeepSpec's evaluator)",
                   "pard": "the PARD reference loop (verify/pard_reference.py, after PARD's pard_infer.py)"}


def reference_for(target, drafter_kind: str | None = None) -> str:
    """Which transcript `token_force` forces against for this (our) target and drafter kind."""
    if getattr(target, "is_hybrid", False):
        return TARGET_GREEDY
    return REFERENCE_LOOPS.get(drafter_kind, STOCK)


def runs_stock_pair(reference: str) -> bool:
    """Whether the reference is the stock pair's run (dflash_generate or a kind's reference loop, with
    acceptance lengths to compare), not the target's greedy AR."""
    return reference != TARGET_GREEDY


@torch.inference_mode()
def run_target_greedy(pair: StockPair, prompt_ids, max_new_tokens: int, stop_ids=(), temperature: float = 0.0,
                      block_size=None, seed=None) -> StockResult:
    """transformers' greedy generation of the stock pair's target alone (run_stock's signature; the
    block size is unused). New tokens, stop token included; no acceptance lengths (no drafter)."""
    if temperature != 0:
        raise ValueError("the target-greedy reference is greedy only (temperature 0)")
    ids = torch.tensor([list(map(int, prompt_ids))], dtype=torch.long, device=pair.device)
    stops = list(stop_ids)
    t0 = time.perf_counter()
    # The attention mask is given: generate would otherwise mask prompt tokens equal to the pad id.
    out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=stops or None, pad_token_id=stops[0] if stops else 0)
    return StockResult(tokens=out[0, ids.shape[1]:].tolist(), acceptance_lengths=[],
                       seconds=time.perf_counter() - t0)
