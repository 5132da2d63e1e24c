"""The disagreements of what users get, our speculative output, for one prompt.

(a) our speculative output vs stock's output and (b) vs our own AR output: identical, or a record
for the first fork (judged by verdict.py); (c) past a fork from stock's output, every token of our
speculative transcript against the referee's argmax, scored in one teacher-forced pass over it.
A fork that is a length difference (one output a strict prefix of the other) cannot be excused.

Each record's `context` names the transcript its position's prefix belongs to: "stock" up to and
including the fork from stock's output (the prefixes are stock's), "spec" past it.
"""
from __future__ import annotations

import math

from .verdict import disagreement


def first_fork(a: list, b: list):
    """The first index where a and b differ (a length difference counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _fork_item(name, check: str, j: int, ours: list, other: list, scores, context: str) -> dict:
    fields = dict(prompt=name, check=check, position=j, context=context)
    if j < len(ours) and j < len(other):
        return disagreement(scores[j], ours[j], other[j], ours=ours[j], other=other[j], **fields)
    return {**fields, "ours": ours[j] if j < len(ours) else None, "other": other[j] if j < len(other) else None,
            "margin": math.inf, "top": 0.0, "referee_choice": None,
            "note": f"lengths differ: ours {len(ours)} tokens, {check.split('-')[-1]} {len(other)}"}


def spec_disagreements(name, stock: list, spec: list, ar: list, score_spec) -> tuple:
    """-> (records, fork from stock or None, fork from AR or None). score_spec() gives the scorer's
    logits [len(spec), V] at the positions that chose each of our speculative tokens; it is called
    only when there is a fork."""
    fork_stock, fork_ar = first_fork(spec, stock), first_fork(spec, ar)
    if fork_stock is None and fork_ar is None:
        return [], None, None
    scores = score_spec()
    items = []
    if fork_stock is not None:
        items.append(_fork_item(name, "spec-vs-stock", fork_stock, spec, stock, scores, "stock"))
    if fork_ar is not None:
        context = "stock" if fork_stock is None or fork_ar <= fork_stock else "spec"
        items.append(_fork_item(name, "spec-vs-ar", fork_ar, spec, ar, scores, context))
    if fork_stock is not None:
        for i in range(fork_stock, len(spec)):
            row = scores[i]
            if row[spec[i]] < row.max():
                best = int(row.argmax())
                items.append(disagreement(row, spec[i], best, prompt=name, check="spec-transcript", position=i,
                                          context="stock" if i == fork_stock else "spec", ours=spec[i], other=best))
    return items, fork_stock, fork_ar
