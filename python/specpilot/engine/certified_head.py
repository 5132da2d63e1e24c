"""Certified coarse-to-fine LM head for the verify step (two-level verification C1,
EngineConfig.two_level = "certified-head"): a torch reference, greedy only.

Level 1, per verify row with final hidden h: the exact logit of every shortlisted token (the draft
token and the draft's top-k at that position) and an upper bound on every other row's logit,
    w_j . h <= c_j . (P h) + rho_j * ||h - P^T P h||          (P: the top-r right singular vectors of W,
                                                                c_j = P w_j, rho_j = ||w_j - P^T c_j||)
(r = 0: Cauchy-Schwarz, ||w_j|| ||h||). Level 1 runs in fp64, so its own rounding is a slack term.
The row is certified when the best shortlisted token's lowest possible *computed* logit beats every
other row's highest possible computed logit, where "computed" is what the exact LM head GEMM of the
single-level engine returns: an fp32-accumulated dot product in any summation order (error <= gamma_K
||h|| ||w_j||, gamma_K = K u / (1 - K u), u = 2^-24) then rounded to the model dtype (bf16: <= 2^-8
relative). The inequality is strict, so the certified token is the exact GEMM's argmax, first-index
tie order included (there is no tie). Level 2: every uncertified row gets its exact logits (the
model's own LM head).

Not covered: a GEMM that reduces partial sums in bf16 (cuBLAS with
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction); our verify GEMMs accumulate in fp32.

The head returns logits a greedy consumer can argmax: a certified row is -inf except its winner (at
its exact value), an uncertified row is the exact row. Sampling needs the full distribution, so the
engine refuses certified-head at temperature > 0. `stats` counts rows, certified rows, and steps
whose *needed* rows (up to the first row that is not a certified match of the draft) were all
certified: at batch 1 an uncertified needed row costs the whole LM head read again, so that per-step
rate is what decides whether a fused kernel could win (docs/two_level.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specpilot.models.draft_vocab import head_weight
from specpilot.ops import linear

TOP_K = 8                      # the draft's top-k per row joins the shortlist (the draft token is its top-1)
FP64_UNIT = 2.0 ** -53
ACCUMULATION_UNIT = 2.0 ** -24  # fp32 accumulation of the exact GEMM
OUTPUT_UNIT = {torch.float64: 0.0, torch.float32: 0.0, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


@dataclass
class HeadBounds:
    """Per-row quantities of an LM head W [V, H], fp64, computed once."""
    weight: torch.Tensor        # [V, H], the model's (its dtype)
    row_norms: torch.Tensor     # [V] ||w_j||
    basis: torch.Tensor         # [r, H] orthonormal rows (r may be 0)
    coords: torch.Tensor        # [V, r] P w_j
    residuals: torch.Tensor     # [V] ||w_j - P^T P w_j||
    defect: float               # sum |P P^T - I|: the basis's departure from orthonormal, a slack term

    @staticmethod
    def build(weight: torch.Tensor, rank: int) -> "HeadBounds":
        w = weight.detach().to(torch.float64)
        v, h = w.shape
        if not 0 <= rank <= h:
            raise ValueError(f"certified head: rank {rank} must be in 0..{h} (the hidden size)")
        row_norms = w.norm(dim=1)
        if rank == 0:
            basis = w.new_zeros(0, h)
        else:
            _, vectors = torch.linalg.eigh(w.T @ w)              # ascending eigenvalues: the last are the top
            basis = vectors[:, -rank:].T.contiguous()
        coords = w @ basis.T
        residuals = (w - coords @ basis).norm(dim=1)
        defect = float((basis @ basis.T - torch.eye(rank, dtype=torch.float64, device=w.device)).abs().sum())
        return HeadBounds(weight, row_norms, basis, coords, residuals, defect)

    def upper_bounds(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, H] fp64 -> [T, V]: an upper bound on w_j . h for every row (exact arithmetic; fp64
        rounding is the caller's slack)."""
        b = h @ self.basis.T                                     # [T, r]
        rest = (h - b @ self.basis).norm(dim=1, keepdim=True)    # [T, 1]
        return b @ self.coords.T + rest * self.residuals[None]


@dataclass
class CertifiedStats:
    rows: int = 0
    certified_rows: int = 0
    steps: int = 0
    steps_needed_certified: int = 0     # every needed row certified: no exact LM head read this step
    per_step: list = field(default_factory=list)

    def summary(self) -> dict:
        return {"rows": self.rows, "certified_rows": self.certified_rows,
                "row_rate": self.certified_rows / max(1, self.rows), "steps": self.steps,
                "steps_without_fallback": self.steps_needed_certified,
                "step_rate": self.steps_needed_certified / max(1, self.steps)}


def certify(h: torch.Tensor, shortlist: torch.Tensor, bounds: HeadBounds, model_dtype) -> tuple:
    """h [T, H] (the LM head's input rows), shortlist [T, k] token ids -> (winner [T] int64,
    certified [T] bool): where certified, winner is the exact LM head's argmax."""
    x = h.detach().to(torch.float64)
    t, hidden = x.shape
    w_short = bounds.weight.index_select(0, shortlist.reshape(-1)).to(torch.float64).view(t, -1, hidden)
    exact = torch.einsum("tkh,th->tk", w_short, x)                                # [T, k] (fp64)
    norms = x.norm(dim=1, keepdim=True) * bounds.row_norms[None]                   # [T, V] ||h|| ||w_j||
    gamma = hidden * ACCUMULATION_UNIT / (1 - hidden * ACCUMULATION_UNIT)
    slack = norms * (gamma + 4 * (hidden + bounds.basis.shape[0] + 2) * FP64_UNIT + 3 * bounds.defect)  # GEMM + fp64
    hi = bounds.upper_bounds(x).scatter(1, shortlist, exact) + slack               # [T, V]
    best_value, best_at = exact.max(dim=1)
    winner = shortlist.gather(1, best_at[:, None])                                 # [T, 1]
    lo = best_value - slack.gather(1, winner)[:, 0]
    out = OUTPUT_UNIT.get(model_dtype)
    if out is None:
        raise ValueError(f"certified head: no rounding bound for model dtype {model_dtype}")
    lo, hi = lo - out * lo.abs(), hi + out * hi.abs()                             # rounding to the model dtype
    rival = hi.scatter(1, winner, float("-inf")).max(dim=1).values
    return winner[:, 0], lo > rival


class CertifiedHead:
    """The engine's certified LM head: built once per target (bounds), bound per verify step to the
    step's drafts and draft logits."""

    def __init__(self, target, rank: int | None = None, top_k: int = TOP_K):
        weight = head_weight(target.lm_head)
        self.target, self.top_k = target, top_k
        self.rank = weight.shape[1] // 8 if rank is None else rank
        self.bounds = HeadBounds.build(weight, self.rank)
        self.stats = CertifiedStats()

    def shortlist(self, block: torch.Tensor, draft_logits: torch.Tensor | None) -> torch.Tensor:
        """block [vs] (anchor, drafts), draft_logits [vs-1, V] or None -> [vs, k]: row i (predicting
        block position i + 1) gets the draft token there and the draft's top-k; the last row, which
        no draft row predicts, gets the last draft row's top-k (a guess; it falls back when wrong)."""
        vs = block.shape[0]
        if draft_logits is None or vs == 1:
            return block.view(1, 1).expand(vs, 1).clone()
        top = torch.topk(draft_logits, min(self.top_k, draft_logits.shape[-1]), dim=-1).indices   # [vs-1, k]
        rows = torch.cat([block[1:, None], top], dim=1)                                        # [vs-1, k+1]
        return torch.cat([rows, rows[-1:]], dim=0)

    def bind(self, block: torch.Tensor, draft_logits: torch.Tensor | None):
        """The head for one verify step of `block` [1, vs]: hidden [1, vs, H] -> greedy logits [1, vs, V]."""
        short = self.shortlist(block[0], None if draft_logits is None else draft_logits[0])

        def head(hidden: torch.Tensor) -> torch.Tensor:
            if hidden.shape[0] != 1:
                raise ValueError(f"certified head: one request per step, got a batch of {hidden.shape[0]}")
            rows = hidden[0]
            winner, certified = certify(rows, short, self.bounds, hidden.dtype)
            logits = rows.new_full((rows.shape[0], self.bounds.weight.shape[0]), float("-inf"))
            sure = certified.nonzero()[:, 0]
            if sure.numel():                                                  # the winner's own logit
                exact = (rows[sure] * self.bounds.weight.index_select(0, winner[sure])).sum(-1)
                logits[sure, winner[sure]] = exact.to(logits.dtype)
            unsure = (~certified).nonzero()[:, 0]
            if unsure.numel():   # level 2: the single-level engine's own LM head call, so its rounding too
                logits[unsure] = linear.linear(self.target.lm_head, hidden)[0, unsure]
            self._count(block[0], winner, certified)
            return logits[None]
        return head

    def _count(self, block, winner, certified) -> None:
        """Rows needed by the greedy rule: up to and including the first row that is not a certified
        match of the next draft (the bonus row); the step needs no exact head when all are certified."""
        s = self.stats
        vs = block.shape[0]
        s.rows += vs
        s.certified_rows += int(certified.sum())
        needed_ok = True
        for i in range(vs):
            if not bool(certified[i]):
                needed_ok = False
                break
            if i + 1 >= vs or int(winner[i]) != int(block[i + 1]):
                break
        s.steps += 1
        s.steps_needed_certified += needed_ok
        s.per_step.append(needed_ok)
