"""The newcomers' prompt chunks on the graphed path (graphed.py): each chunk cut into tiles of
`prefill_tile` rows, one padded request of a graphed forward each (its rows causal over the request's
cache, which holds the tiles before it), logits only at each tile's last row.

A step with decode rows carries its chunks in the decode rows' own forward (DecodeGraphs.mixed: one
pass over the weights for both, as a serving engine's mixed batch); the steps of prompt rows only take
the prefill forward (DecodeGraphs.prefill). A step's chunks fit one forward's tiles
(BatchEngine._chunks): a second forward would read every weight again. Batched AR and the speculative
engines prefill the same way."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from . import forward, graphed
from .draft_context import append_context


@dataclass
class TilePlan:
    chunks: list            # (state, rows) of each chunk, in order
    segments: list          # forward.Segment per tile
    first_tile: list        # each chunk's first tile
    ids: np.ndarray         # int64 [tiles * tile]: the prompt ids, each tile's padding rows 0
    logit_rows: np.ndarray  # int64 [tiles]: each tile's last real row within the tiles' rows

    def arrays(self, engine, tiles: int, keys: int) -> list:
        """Host arrays of `prefill`'s inputs (a mixed forward's tiles) padded to `tiles` tiles over `keys`
        key positions: positions, slots, keys, last, ids, logit rows."""
        tile = engine.graphs.prefill_tile
        arrays = forward.padded(self.segments, tiles, tile, keys, engine.page_size, engine.trash_slot,
                                paged=engine.graphs.paged)
        ids, rows = np.zeros(tiles * tile, dtype=np.int64), np.zeros(tiles, dtype=np.int64)
        ids[:self.ids.size], rows[:self.logit_rows.size] = self.ids, self.logit_rows
        return arrays + [ids, rows]


EMPTY = TilePlan([], [], [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))   # warmup's all-padding tiles


def plan(engine, chunks: list) -> TilePlan:
    """The tiles of a step's chunks (BatchEngine._chunks keeps them within one forward's tiles)."""
    tile = engine.graphs.prefill_tile
    need = sum(-(-rows // tile) for _, rows in chunks)
    if need > engine.graphs.prefill_requests:
        raise RuntimeError(f"prefill chunks need {need} tiles, one forward takes {engine.graphs.prefill_requests}")
    segments, first_tile, ids = [], [], []
    for s, rows in chunks:
        first_tile.append(len(segments))
        for a in range(0, rows, tile):
            segments.append(forward.Segment(s.pages, s.prefilled + a, min(tile, rows - a)))
        prompt = np.zeros(-(-rows // tile) * tile, dtype=np.int64)
        prompt[:rows] = s.req.prompt_ids[s.prefilled:s.prefilled + rows]
        ids.append(prompt)
    counts = np.fromiter((seg.rows for seg in segments), dtype=np.int64, count=len(segments))
    return TilePlan(chunks, segments, first_tile, np.concatenate(ids), np.arange(len(segments)) * tile + counts - 1)


def upload(engine, plan_: TilePlan, tiles: int, keys: int) -> tuple:
    """`prefill`'s device inputs for a plan padded to `tiles` tiles (see TilePlan.arrays)."""
    return as_inputs(engine, engine.staging.upload(plan_.arrays(engine, tiles, keys)), tiles)


def as_inputs(engine, uploaded: list, tiles: int) -> tuple:
    """TilePlan.arrays uploaded -> (ids, positions, slots, keys [P, K], last [P, tile], logit rows)."""
    positions, slots, keys, last, ids, rows = uploaded
    return ids, positions, slots, keys.view(tiles, -1), last.view(tiles, engine.graphs.prefill_tile), rows


def prefill_alone(engine, chunks: list) -> None:
    """A step of prompt rows only: its chunks through the prefill forward."""
    p = plan(engine, chunks)
    tiles = graphed.request_bucket(len(p.segments))
    keys = engine.graphs.key_bucket(max(s.start + s.rows for s in p.segments))
    logits, features = engine.graphs.prefill(*upload(engine, p, tiles, keys))
    done(engine, p, logits, features, torch.argmax(logits, dim=-1).tolist())


def done(engine, plan_: TilePlan, logits, features, greedy: list) -> None:
    """Each chunk's bookkeeping from its tiles' outputs: logits [tiles, V] (the tiles' last rows),
    features [tiles * tile, F] or None, greedy: the argmax of each logits row, on the host.
    The graph's outputs are rewritten by its next replay, so a DFlash drafter's context takes the
    chunks' features now, in one forward (the newcomer's first draft then finds nothing pending and
    the step's context append stays graphed); other drafter kinds read state.ctx their own way, so
    they get a copy."""
    tile = engine.graphs.prefill_tile
    write_now = features is not None and engine.kind_drafting is None
    for (s, rows), first in zip(plan_.chunks, plan_.first_tile):
        feats = features[first * tile:first * tile + rows] if features is not None else None
        if feats is not None and not write_now:
            feats = feats.clone()
        last = first + -(-rows // tile) - 1
        prefilled(engine, s, rows, feats, logits[last:last + 1], greedy[last])
    if write_now:
        append_context(engine, [s for s, _ in plan_.chunks])


def prefilled(engine, s, rows: int, feats, logits, greedy) -> None:
    """A prefill chunk's bookkeeping: its features to the draft context, the prompt rows counted, and
    after the prompt's last row its first token (logits [1, V] of that row and its argmax)."""
    if feats is not None:
        s.ctx.append((feats, s.prefilled))
    s.prefilled += rows
    if s.decoding:
        s.tokens = [greedy if s.req.temperature == 0 else engine.sample_first(s, logits[None])]
        s.first_token_s = time.perf_counter()          # a host event (BatchEngine.clock)
        s.start = s.prompt_len
        s.stopped = s.tokens[0] in s.req.stop_ids
