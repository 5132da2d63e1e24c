"""How far each side's logits sit from the referee's (the target at a higher precision), over every
forced position: the RMS of (logits - referee logits) over positions and vocabulary, and how often each
side's argmax is the referee's. A bf16 engine that is merely rounded differently from stock shows about
stock's numbers; a less exact one shows a larger error. The verdict's noise is the largest of these
RMS errors (verdict.py). Each side's error per position is kept too, for its typical ratio to stock's
at the same positions (the median: the RMS is ruled by a few sensitive positions, where every side's
error is large and its ratio to stock's noise).
"""
from __future__ import annotations

import torch


class ArbiterErrorTally:
    def __init__(self):
        self._squares, self._values, self._positions, self._same_argmax = {}, {}, {}, {}
        self._per_position = {}                  # side -> [T] RMS errors over the vocabulary, per add

    def add(self, side: str, logits: torch.Tensor, reference: torch.Tensor) -> None:
        """logits [T, V] of one side and the referee's logits [T, V] at the same positions."""
        if logits.shape != reference.shape:
            raise ValueError(f"{side}: logits {tuple(logits.shape)} vs referee {tuple(reference.shape)}")
        logits = logits.float().to(reference.device)
        squares = (logits - reference).double().square()
        self._squares[side] = self._squares.get(side, 0.0) + float(squares.sum())
        self._per_position.setdefault(side, []).append(squares.mean(-1).sqrt().cpu())
        self._values[side] = self._values.get(side, 0) + logits.numel()
        self._positions[side] = self._positions.get(side, 0) + logits.shape[0]
        same = int((logits.argmax(-1) == reference.argmax(-1)).sum())
        self._same_argmax[side] = self._same_argmax.get(side, 0) + same

    def last_position_errors(self, side: str) -> torch.Tensor:
        """[T] this side's RMS error over the vocabulary at each position of its last add."""
        return self._per_position[side][-1]

    def typical_ratio(self, side: str) -> float:
        """The median over positions of this side's error / stock's at the same position (0 / 0 counts
        as 1); the sides must have been added at the same positions."""
        mine, stock = torch.cat(self._per_position[side]), torch.cat(self._per_position["stock"])
        if mine.shape != stock.shape:
            raise ValueError(f"{side}: {mine.numel()} positions vs stock's {stock.numel()}")
        ratio = torch.where(stock > 0, mine / stock.clamp_min(1e-300),
                            torch.where(mine > 0, torch.full_like(mine, torch.inf), torch.ones_like(mine)))
        return float(ratio.median())

    def summary(self) -> dict:
        """side -> {rms_error, same_argmax, positions[, typical_ratio]} in the order the sides were first
        added; typical_ratio (to stock's) for every other side once a "stock" side exists."""
        out = {side: {"rms_error": (self._squares[side] / max(1, self._values[side])) ** 0.5,
                      "same_argmax": self._same_argmax[side], "positions": self._positions[side]}
               for side in self._squares}
        if "stock" in out:
            for side in out:
                if side != "stock":
                    out[side]["typical_ratio"] = self.typical_ratio(side)
        return out
