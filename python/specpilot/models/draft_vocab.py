"""A reduced draft vocabulary: the drafter's LM head over the N most frequent tokens only (FR-Spec,
arXiv 2502.14856), selected by EngineConfig.draft_vocab (0: the full head).

The drafter only proposes; the target verifies every draft with its full LM head, so which tokens
the drafter may propose cannot change any output, only how many drafts are accepted. What it buys:
the draft step reads N rows of the LM head instead of V (on Qwen3-8B the full head is 1.24 GB of
the ~3.3 GB a draft step reads).

The ranking is a JSON file (`specpilot draft-vocab` writes it): {"vocab_size", "source", "ranking":
[token ids, most frequent first, every id of the vocabulary once]}. It is looked up as
EngineConfig.draft_vocab_ranking, else `token_ranking.json` in the drafter's folder.

How the head runs: one GEMM over the N kept rows (a contiguous copy of N x H weights, made once outside
any capture; a split12 head's rows are decoded to the model dtype), then the N logits scattered into a full-V
row filled with -inf. So every consumer of draft logits (the argmax, the fused step's kernels,
rejection sampling) runs unchanged: a token outside the kept set has draft probability 0 and is
never proposed. The kept ids are sorted ascending, so the argmax's tie order (first index) is the
full head's order restricted to the kept rows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specpilot.ops import linear

RANKING_FILE = "token_ranking.json"


@dataclass(frozen=True)
class TokenRanking:
    ids: tuple          # every token id once, most frequent first
    vocab_size: int
    source: str         # what was counted (free text, for the record)

    def __post_init__(self):
        if sorted(self.ids) != list(range(self.vocab_size)):
            raise ValueError(f"a token ranking must list every id of the vocabulary (0..{self.vocab_size - 1}) "
                             f"exactly once; got {len(self.ids)} ids")

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps({"vocab_size": self.vocab_size, "source": self.source, "ranking": list(self.ids)}))
        return path

    @staticmethod
    def load(path) -> "TokenRanking":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"token ranking {path} does not exist (write one with `specpilot draft-vocab`)")
        try:
            row = json.loads(path.read_text())
            return TokenRanking(tuple(int(i) for i in row["ranking"]), int(row["vocab_size"]), str(row.get("source", "")))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a token ranking (need vocab_size and ranking): {e}") from None

    @staticmethod
    def from_counts(counts: torch.Tensor, source: str) -> "TokenRanking":
        """counts [V] (int) -> ids by count, descending; equal counts by id (a stable order)."""
        order = torch.argsort(-counts.to(torch.int64), stable=True)
        return TokenRanking(tuple(order.tolist()), counts.numel(), source)


def ranking_path(config, drafter) -> Path:
    if config.draft_vocab_ranking is not None:
        return Path(config.draft_vocab_ranking)
    folder = getattr(drafter, "source_dir", None)
    if folder is None:
        raise ValueError("draft_vocab > 0 needs a token ranking: set EngineConfig.draft_vocab_ranking "
                         "(the drafter was not loaded from a folder)")
    return Path(folder) / RANKING_FILE


def head_weight(lm_head: nn.Module) -> torch.Tensor:
    """The LM head's weight [V, H] in the model's dtype (a split12 head decoded)."""
    weight = getattr(lm_head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight
    if hasattr(lm_head, "packed"):
        from specpilot.formats.split12 import ops as split12_ops

        return split12_ops.unpack(lm_head.packed())
    raise TypeError(f"cannot read the rows of an LM head of type {type(lm_head).__name__}")


class ReducedDraftHead(nn.Module):
    """The LM head restricted to `ids` (int64 [N], sorted): logits over them, expanded to a full row."""

    def __init__(self, lm_head: nn.Module, ids: torch.Tensor, vocab_size: int):
        super().__init__()
        weight = head_weight(lm_head)
        ids = torch.sort(ids.to(torch.int64)).values.to(weight.device)
        self.vocab_size = vocab_size
        self.register_buffer("ids", ids)
        self.proj = nn.Linear(weight.shape[1], ids.numel(), bias=False, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(weight.index_select(0, ids))
        self.proj.requires_grad_(False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits over the kept ids [..., N]."""
        return linear.linear(self.proj, hidden)

    def expand(self, kept: torch.Tensor) -> torch.Tensor:
        """kept [..., N] -> [..., V]: the kept logits at their ids, -inf elsewhere."""
        full = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(full.dim() - 1, self.ids, kept)


def prepare_draft_vocab(drafter, config) -> None:
    """Builds (once per size and ranking) the reduced head the drafter uses under `config`; call it
    outside any graph capture (Engine.__init__ does)."""
    n = config.draft_vocab
    if drafter is None or n == 0:
        return
    vocab = drafter.target.config.vocab_size
    if not 1 <= n <= vocab:
        raise ValueError(f"draft_vocab={n} must be in 1..{vocab} (the vocabulary size), or 0 for the full head")
    path = ranking_path(config, drafter)
    key = (n, str(path))
    heads = drafter.__dict__.setdefault("reduced_heads", {})
    if key in heads:
        return
    ranking = TokenRanking.load(path)
    if ranking.vocab_size != vocab:
        raise ValueError(f"token ranking {path} is for a vocabulary of {ranking.vocab_size}, the target's has {vocab}")
    heads[key] = ReducedDraftHead(drafter.target.lm_head, torch.tensor(ranking.ids[:n]), vocab)


def reduced_head_for(drafter, config):
    """The reduced head `config` selects for this drafter, or None for the full head."""
    if config.draft_vocab == 0:
        return None
    heads = drafter.__dict__.get("reduced_heads", {})
    head = heads.get((config.draft_vocab, str(ranking_path(config, drafter))))
    if head is None:
        raise RuntimeError(f"draft_vocab={config.draft_vocab}: the reduced head was not prepared "
                           "(models.draft_vocab.prepare_draft_vocab, which Engine.__init__ calls)")
    return head
