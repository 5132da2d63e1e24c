"""Gate for verification (acceptance) candidates: chain acceptance must equal the reference rule.

Contract of a chain-accept op: fn(draft [B, K] int64, target [B, K+1] int64) -> accepted [B]: the
number of leading draft tokens equal to the target's greedy tokens (0..K); exact, no tolerance.
Fresh random cases every run, mismatches at every position, rows with full acceptance included.
"""
import os

import torch

from specpilot.agents.gate import GateResult, Verdict


def reference_chain_accept(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    match = (draft == target[:, : draft.shape[1]]).to(torch.int64)   # [B, K]
    return match.cumprod(dim=1).sum(dim=1)                           # [B]


def check_chain_accept(fn, batch: int = 256, k: int = 16, vocab: int = 50, device: str = "cpu") -> GateResult:
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    target = torch.randint(0, vocab, (batch, k + 1), generator=gen)
    draft = target[:, :k].clone()
    first_miss = torch.randint(0, k + 1, (batch,), generator=gen)     # k: the whole block matches
    for b in range(batch):
        if first_miss[b] < k:
            draft[b, first_miss[b]] = (target[b, first_miss[b]] + 1 + torch.randint(0, vocab - 1, (1,), generator=gen)) % vocab
            draft[b, first_miss[b] + 1:] = torch.randint(0, vocab, (k - 1 - int(first_miss[b]),), generator=gen)
    want = reference_chain_accept(draft, target)
    try:
        got = fn(draft.to(device), target.to(device)).to("cpu", torch.int64)
    except Exception as e:
        return GateResult(False, [Verdict("chain_accept", False, f"crash: {type(e).__name__}: {e}")])
    if got.shape != want.shape or not torch.equal(got, want):
        bad = int((got != want).sum()) if got.shape == want.shape else batch
        over = int((got > want).sum()) if got.shape == want.shape else 0
        return GateResult(False, [Verdict("chain_accept", False,
                                          f"{bad} of {batch} rows accept a different count than the reference "
                                          f"({over} accept more: drafts the target rejected were accepted)")])
    return GateResult(True, [Verdict("chain_accept", True)])
