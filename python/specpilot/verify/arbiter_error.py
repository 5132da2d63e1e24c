"""How far each side's logits sit from the referee's (the target at a higher precision), over every
forced position: the RMS of (logits - referee logits) over positions and vocabulary, and how often each
side's argmax is the referee's. A bf16 engine that is merely rounded differently from stock shows about
stock's numbers; a less exact one shows a larger error. The verdict's noise is the largest of these
RMS errors (verdict.py).
"""
from __future__ import annotations

import torch


class ArbiterErrorTally:
    def __init__(self):
        self._squares, self._values, self._positions, self._same_argmax = {}, {}, {}, {}

    def add(self, side: str, logits: torch.Tensor, reference: torch.Tensor) -> None:
        """logits [T, V] of one side and the referee's logits [T, V] at the same positions."""
        if logits.shape != reference.shape:
            raise ValueError(f"{side}: logits {tuple(logits.shape)} vs referee {tuple(reference.shape)}")
        logits = logits.float().to(reference.device)
        self._squares[side] = self._squares.get(side, 0.0) + float((logits - reference).square().sum())
        self._values[side] = self._values.get(side, 0) + logits.numel()
        self._positions[side] = self._positions.get(side, 0) + logits.shape[0]
        same = int((logits.argmax(-1) == reference.argmax(-1)).sum())
        self._same_argmax[side] = self._same_argmax.get(side, 0) + same

    def summary(self) -> dict:
        """side -> {rms_error, same_argmax, positions}, in the order the sides were first added."""
        return {side: {"rms_error": (self._squares[side] / max(1, self._values[side])) ** 0.5,
                       "same_argmax": self._same_argmax[side], "positions": self._positions[side]}
                for side in self._squares}
