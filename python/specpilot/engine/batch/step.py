"""The draft and verify halves of a BatchEngine step, over groups of requests: the whole batch in
one forward (the batching mechanisms on) or one request per forward (off)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from specpilot.engine.accept import commit, matched_drafts, new_tokens
from specpilot.verify.sampling import rejection_sample, sample_probs, sampling_probs

from . import forward, forward_hybrid, graphed, prefill_tiles
from .draft_context import append_context
from .paged import stack_tables, table_slots


@dataclass
class Draft:
    blocks: torch.Tensor              # int64: its group's blocks, concatenated; this request's at [offset, offset + rows)
    offset: int
    rows: int
    probs: torch.Tensor | None        # [rows - 1, V] draft sampling probabilities (temperature > 0)
    padded: bool = False              # blocks is the graphed draft's padded layout (request r's at r * block)

    @property
    def block(self) -> torch.Tensor:  # the anchor, then the drafts
        return self.blocks[self.offset:self.offset + self.rows]


def _groups(states: list, together: bool) -> list:
    if not states:
        return []
    return [states] if together else [[s] for s in states]


def draft_all(engine, decoding: list) -> dict:
    """Request id -> Draft for every decoding request: its pending context appended to the draft cache,
    then its block [anchor, mask x (rows - 1)], rows = min(block, max_length - start), drafted (the
    block forward graphed when engine.graphs is on, over blocks padded to the block size).
    A group's anchors and replayed drafts go up with its layout in one copy, and its blocks are
    assembled on the device in one gather (_block_sources)."""
    if engine.kind_drafting is not None:
        return _draft_kind(engine, decoding)
    drafter = engine.drafter
    drafts = {}
    for group in _groups(decoding, engine.config.batched_draft):
        if not _context_graphed(engine, group):
            append_context(engine, group)
        segments = [forward.Segment(s.pages, s.start, min(engine.block_size, s.max_length - s.start)) for s in group]
        last = forward.block_last(segments)
        if engine.graphs is not None and engine.config.batched_draft:
            t = engine.block_size
            requests, _, arrays = engine.graphs.padded(segments, t, last)
            offsets, draft_rows = [r * t for r in range(len(group))], [r * (t - 1) for r in range(len(group))]
            sources = _block_sources(engine, group, segments, offsets, draft_rows, requests * t)
            positions, slots, keys, padded_last, block_ids, host_tokens, source = engine.staging.upload(arrays + sources)
            logits = engine.graphs.draft(block_ids, positions, slots, keys.view(requests, -1),
                                         padded_last.view(requests, t))
        else:
            offsets = np.cumsum([0] + [seg.rows for seg in segments])[:-1].tolist()
            draft_rows = np.cumsum([0] + [seg.rows - 1 for seg in segments])[:-1].tolist()
            sources = _block_sources(engine, group, segments, offsets, draft_rows, sum(seg.rows for seg in segments))
            layout = forward.Layout(segments, engine.page_size, engine.staging, last=last,
                                    extra=sources + [forward.block_keep(segments)])
            block_ids, host_tokens, source, keep = layout.extra
            with engine.kernels(block_ids.shape[0]):
                logits = forward.draft_block(drafter, engine.draft_cache, layout, block_ids, keep)
        blocks = torch.cat([host_tokens, torch.argmax(logits, dim=-1)])[source]
        for s, seg, offset, row in zip(group, segments, offsets, draft_rows):
            k = seg.rows - 1
            probs = None
            if s.req.temperature > 0:
                probs = sampling_probs(logits[None, row:row + k], s.req.temperature, s.req.top_p)[0]
                blocks[offset + 1:offset + seg.rows] = sample_probs(probs[None], s.generator)[0]
            drafts[s.id] = Draft(blocks=blocks, offset=offset, rows=seg.rows, probs=probs,
                                 padded=engine.graphs is not None and engine.config.batched_draft)
    return drafts


def _draft_kind(engine, decoding: list) -> dict:
    """draft_all for the kinds of kind_drafting.py: the kind drafts each group (eager), the blocks are
    assembled as DFlash's (anchors and replayed drafts from the host, the rest the kind's drafts)."""
    drafts = {}
    for group in _groups(decoding, engine.config.batched_draft):
        segments = [forward.Segment(s.pages, s.start, min(engine.block_size, s.max_length - s.start)) for s in group]
        offsets = np.cumsum([0] + [seg.rows for seg in segments])[:-1].tolist()
        draft_rows = np.cumsum([0] + [seg.rows - 1 for seg in segments])[:-1].tolist()
        drafted, probs = engine.kind_drafting.propose(group, segments)
        _, host_tokens, source = _block_sources(engine, group, segments, offsets, draft_rows,
                                                sum(seg.rows for seg in segments))
        host_tokens, source = engine.staging.upload([host_tokens, source])
        blocks = torch.cat([host_tokens, drafted])[source]
        for s, seg, offset, p in zip(group, segments, offsets, probs):
            drafts[s.id] = Draft(blocks=blocks, offset=offset, rows=seg.rows, probs=p)
    return drafts


def _context_graphed(engine, group: list) -> bool:
    """Appends the group's pending context through the context graph when each pending request's one
    context piece is a view of its rows in the last graphed verify's features output
    (engine.graph_features): one gather of those rows into the padded layout, no per-request
    concatenation. False (nothing done) otherwise."""
    states = [s for s in group if s.ctx]
    if engine.graph_features is None or not states or not engine.config.batched_draft:
        return False
    features, first_rows = engine.graph_features
    # row i of `features` sits at base + i * row_bytes: a piece's data pointer names its first row
    # without a view per request
    base, row_bytes = features.data_ptr(), features.stride(0) * features.element_size()
    if not all(len(s.ctx) == 1 and s.id in first_rows
               and s.ctx[0][0].data_ptr() == base + first_rows[s.id] * row_bytes for s in states):
        return False
    t, n = engine.block_size, len(states)
    requests = graphed.request_bucket(n)
    starts = np.fromiter((s.ctx[0][1] for s in states), dtype=np.int64, count=n)
    produced = np.fromiter((s.ctx[0][0].shape[0] for s in states), dtype=np.int64, count=n)
    first = np.fromiter((first_rows[s.id] for s in states), dtype=np.int64, count=n)
    table = stack_tables([s.pages for s in states], starts + produced - 1, engine.page_size)
    for s in states:
        s.ctx = []
    index, positions = np.zeros((requests, t), dtype=np.int64), np.zeros((requests, t), dtype=np.int64)
    slots = np.full((requests, t), engine.trash_slot, dtype=np.int64)
    rows = np.arange(t)
    real = rows < produced[:, None]
    pos = starts[:, None] + np.minimum(rows, produced[:, None] - 1)
    index[:n] = np.where(real, first[:, None] + rows, 0)
    positions[:n] = np.where(real, pos, starts[:, None])         # padding rows: a valid rope row, the trash slot
    slots[:n] = np.where(real, table_slots(table, np.arange(n)[:, None], pos, engine.page_size), engine.trash_slot)
    index, positions, slots = engine.staging.upload([index.ravel(), positions.ravel(), slots.ravel()])
    engine.graphs.context(features[index], positions, slots)
    return True


def _block_sources(engine, group, segments, offsets, draft_rows, total: int) -> list:
    """Host arrays of a group's block forward: its input ids [total] (each block's anchor, then mask
    ids), the host tokens (the anchors, request by request, then the replayed requests' planned drafts)
    and `source` [total], which picks each block row from [host tokens, the drafter's argmax rows]: the
    anchor, a planned draft (replay: the drafter still runs, its tokens are overwritten) or the
    drafter's row (request r's at draft_rows[r] + j). Padding rows pick host token 0 (never read)."""
    drafter = engine.drafter
    n = len(group)
    offsets, draft_rows = np.asarray(offsets, dtype=np.int64), np.asarray(draft_rows, dtype=np.int64)
    k = np.fromiter((seg.rows - 1 for seg in segments), dtype=np.int64, count=n)      # drafts per block
    anchors = [s.tokens[-1] for s in group]
    plans = [s.req.replay.planned_drafts(len(s.acceptance), s.start - s.prompt_len, seg.rows - 1,
                                         drafter.config.vocab_size) if s.req.replay is not None else None
             for s, seg in zip(group, segments)]
    replayed = np.fromiter((p is not None for p in plans), dtype=bool, count=n)
    host_tokens = np.fromiter(itertools.chain(anchors, *(p for p in plans if p is not None)), dtype=np.int64)
    block_in = np.full(total, drafter.mask_token_id, dtype=np.int64)
    block_in[offsets] = anchors
    source = np.zeros(total, dtype=np.int64)
    source[offsets] = np.arange(n)
    request = np.repeat(np.arange(n), k)                          # each draft row's request
    j = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)  # and its index among the block's drafts
    planned = k * replayed
    plan_first = n + np.cumsum(planned) - planned                 # each replayed request's plan in host_tokens
    source[offsets[request] + 1 + j] = np.where(replayed[request], plan_first[request] + j,
                                                len(host_tokens) + draft_rows[request] + j)
    return [block_in, host_tokens, source]


def verify_and_accept(engine, decoding: list, drafts: dict, lengths: dict, chunks: list) -> None:
    """The target over every decoding request's verify rows and every (state, rows) prefill chunk, then
    per request the accept / commit rule, or the prefill's bookkeeping (and first token). With
    BatchConfig.verify_prefix the verify runs in two passes (prefix_first.py)."""
    engine.graph_features = None
    if engine.config.verify_prefix and drafts:
        from . import prefix_first        # it builds on this module's verify and commit
        return prefix_first.verify_and_accept(engine, decoding, drafts, chunks)
    windows = {s.id: (0, lengths[s.id]) for s in decoding}
    results, _ = verify(engine, decoding, drafts, windows, chunks, engine.graph_rows(lengths) if decoding else None)
    for s, logits, features, ids_host, posterior in results:
        _accept(engine, s, drafts.get(s.id), len(ids_host), logits, features, ids_host, posterior)


def verify(engine, decoding: list, drafts: dict, windows: dict, chunks: list, graph_rows: int | None,
           also_read: torch.Tensor | None = None) -> tuple:
    """One verify pass: the target over each decoding request's window of its block (windows: id ->
    (skip, rows): block rows [skip, skip + rows), the rows before skip already in the cache) and every
    prefill chunk (whose bookkeeping and first token it does). The decode rows are graphed
    (engine.graphs) when graph_rows (T: rows per request of the padded layout, >= every window) is
    given, the prefill chunks then riding in the same forward as tiles (prefill_tiles.py); else one
    varlen forward per group whose layout, host token ids (AR anchors, prompt chunks) and the index
    that picks each row's id from [drafted blocks, host ids] go up in one copy. Either way the
    target's argmax and the verified ids (and `also_read`, int64) come back in one read.
    Returns ([(state, logits [rows, V], features [rows, F] or None, ids, posterior)] per decoding
    request, also_read's host list or None)."""
    if (graph_rows is not None and engine.graphs is not None and engine.config.ragged_verify and decoding
            and (not drafts or engine.config.batched_draft)):
        launched = _launch_graphed(engine, decoding, drafts, windows, graph_rows, also_read,
                                   prefill_tiles.plan(engine, chunks) if chunks else None)
        return _finish_graphed(engine, *launched)
    if chunks and not decoding and engine.graphs is not None:        # a step of prompt rows only
        prefill_tiles.prefill_alone(engine, chunks)
        return [], (also_read.tolist() if also_read is not None else None)
    return _verify_eager(engine, decoding, drafts, windows, chunks, also_read)


def _verify_eager(engine, decoding: list, drafts: dict, windows: dict, chunks: list, also_read) -> tuple:
    """verify's eager path: one varlen forward per group over its decode windows and prefill chunks."""
    entries = [(s, forward.Segment(s.pages, s.start + windows[s.id][0], windows[s.id][1]), True) for s in decoding]
    entries += [(s, forward.Segment(s.pages, s.prefilled, rows), False) for s, rows in chunks]
    results, extra = [], None
    for group in _groups(entries, engine.config.ragged_verify):
        pieces = []                                   # the drafted blocks tensors this group verifies
        for s, _, verifying in group:
            d = drafts.get(s.id) if verifying else None
            if d is not None and all(p is not d.blocks for p in pieces):
                pieces.append(d.blocks)
        piece_base = np.cumsum([0] + [p.shape[0] for p in pieces])
        host_ids, flat, logit_rows, at = [], [], [], 0
        for s, seg, verifying in group:
            d = drafts.get(s.id) if verifying else None
            if d is not None:
                first = piece_base[next(i for i, p in enumerate(pieces) if p is d.blocks)] + d.offset + windows[s.id][0]
            else:
                first = piece_base[-1] + len(host_ids)
                host_ids.extend([s.tokens[-1]] if verifying else map(int, s.req.prompt_ids[s.prefilled:s.prefilled + seg.rows]))
            flat.append(np.arange(first, first + seg.rows))
            if verifying:
                logit_rows.extend(range(at, at + seg.rows))
            elif s.prefilled + seg.rows == s.prompt_len:
                logit_rows.append(at + seg.rows - 1)      # the prompt's last row: the first token
            at += seg.rows
        layout = forward.Layout([seg for _, seg, _ in group], engine.page_size, engine.staging,
                                extra=[np.asarray(host_ids, dtype=np.int64), np.concatenate(flat), np.asarray(logit_rows)])
        host_dev, flat_dev, logit_rows_dev = layout.extra
        ids = torch.cat(pieces + [host_dev])[flat_dev]
        with engine.kernels(at):
            if engine.recurrent is not None:                # a hybrid recurrent target
                logits, features = forward_hybrid.target_forward(engine, layout, ids, [(s, v) for s, _, v in group],
                                                                 logit_rows_dev)
            else:
                logits, features = forward.target_forward(engine.target, engine.cache, layout, ids,
                                                          engine.feature_layers, logit_rows_dev)
        posterior, ids_host, extra_host = _read_back(logits, ids, also_read if extra is None else None)
        extra = extra_host if extra is None else extra
        at = lrow = 0
        for s, seg, verifying in group:
            feats = features[at:at + seg.rows] if features is not None else None
            if verifying:
                results.append((s, logits[lrow:lrow + seg.rows], feats, ids_host[at:at + seg.rows],
                                posterior[lrow:lrow + seg.rows]))
                lrow += seg.rows
            else:
                done = s.prefilled + seg.rows == s.prompt_len
                prefill_tiles.prefilled(engine, s, seg.rows, feats, logits[lrow:lrow + 1] if done else None,
                                        posterior[lrow] if done else None)
                lrow += done
            at += seg.rows
    return results, extra


def _read_back(logits, ids, also_read) -> tuple:
    """(the target's argmax per row, the ids, also_read or None) as host lists, in one transfer."""
    parts = [torch.argmax(logits, dim=-1), ids] + ([also_read] if also_read is not None else [])
    host = torch.cat(parts).tolist()
    n, m = logits.shape[0], ids.shape[0]
    return host[:n], host[n:n + m], (host[n + m:] if also_read is not None else None)


def _launch_graphed(engine, decoding: list, drafts: dict, windows: dict, t: int, also_read, tiles=None) -> tuple:
    """The decode rows' target forward, graphed over R requests x T rows (T: the block, 1 for AR, or a
    prefix-first pass's rows): request r verifies the padded rows [r*T, r*T + its window's rows).
    Whole blocks read the graphed draft's padded blocks as they are; other windows gather their ids.
    With `tiles` (a prefill_tiles.TilePlan) the chunks ride in the same forward (DecodeGraphs.mixed).
    Launched, not read back (_finish_graphed)."""
    graphs = engine.graphs
    segments = [forward.Segment(s.pages, s.start + windows[s.id][0], windows[s.id][1]) for s in decoding]
    every = segments + (tiles.segments if tiles is not None else [])
    requests, keys = graphed.request_bucket(len(segments)), graphs.key_bucket(max(s.start + s.rows for s in every))
    arrays = forward.padded(segments, requests, t, keys, engine.page_size, engine.trash_slot, paged=graphs.paged)
    tile_count = min(b for b in graphs.tile_buckets() if b >= len(tiles.segments)) if tiles is not None else 0
    tile_arrays = tiles.arrays(engine, tile_count, keys) if tiles is not None else []
    if drafts and drafts[decoding[0].id].padded and t == engine.block_size and not any(windows[s.id][0] for s in decoding):
        uploaded = engine.staging.upload(arrays + tile_arrays)
        ids = drafts[decoding[0].id].blocks                 # [R*T]: the graphed draft's padded blocks
    elif drafts:
        n = len(decoding)
        first = np.fromiter((drafts[s.id].offset + windows[s.id][0] for s in decoding), dtype=np.int64, count=n)
        rows = np.fromiter((seg.rows for seg in segments), dtype=np.int64, count=n)
        source = np.zeros((requests, t), dtype=np.int64)    # padding rows read block row 0 (never used)
        source[:n] = first[:, None] + np.minimum(np.arange(t), rows[:, None] - 1)
        uploaded = engine.staging.upload(arrays + [source.ravel()] + tile_arrays)
        ids = drafts[decoding[0].id].blocks[uploaded[4]]
    else:
        anchors = np.zeros(requests * t, dtype=np.int64)
        anchors[[r * t for r in range(len(decoding))]] = [s.tokens[-1] for s in decoding]
        uploaded = engine.staging.upload(arrays + [anchors] + tile_arrays)
        ids = uploaded[4]
    positions, slots, key_array, padded_last = uploaded[:4]
    decode_inputs = (ids, positions, slots, key_array.view(requests, -1), padded_last.view(requests, t))
    if tiles is not None:
        tile_inputs = prefill_tiles.as_inputs(engine, uploaded[-6:], tile_count)
        logits, features = graphs.mixed(*decode_inputs, tile_inputs)
    else:
        logits, features = graphs.target(*decode_inputs)
    return decoding, segments, t, logits, features, ids, also_read, tiles


def _finish_graphed(engine, decoding, segments, t, logits, features, ids, also_read, tiles) -> tuple:
    """The graphed pass's one read-back and its per-request results (verify's), then the bookkeeping of
    the chunks that rode in it (logits and features past the decode rows); the feature output and each
    request's first row are kept in engine.graph_features for the next draft's context."""
    posterior, ids_host, extra = _read_back(logits, ids, also_read)
    results = []
    for r, (s, seg) in enumerate(zip(decoding, segments)):
        a, b = r * t, r * t + seg.rows
        results.append((s, logits[a:b], features[a:b] if features is not None else None, ids_host[a:b], posterior[a:b]))
    if features is not None:
        engine.graph_features = (features, {s.id: r * t for r, s in enumerate(decoding)})
    if tiles is not None:
        rows = ids.shape[0]                    # the decode rows: R * T
        prefill_tiles.done(engine, tiles, logits[rows:], features[rows:] if features is not None else None,
                           posterior[rows:])
    return results, extra


def _accept(engine, s, draft, rows: int, logits, features, block_list: list, posterior: list) -> None:
    """One request's verify rows (logits [rows, V]; on the host: its verify ids and the target's argmax
    per row) -> its committed tokens (engine/spec.py's rule)."""
    r = s.req
    if r.temperature > 0:
        block = draft.block[:rows] if draft is not None else None
        target_probs = sampling_probs(logits[None], r.temperature, r.top_p)     # [1, rows, V]
        if rows == 1:
            accepted, new = 0, [int(sample_probs(target_probs[:, -1], s.generator)[0])]
        else:
            accepted, bonus = rejection_sample(block[None, 1:], target_probs, draft.probs[None, :rows - 1],
                                               s.generator)
            new = block[1:accepted + 1].tolist() + [int(bonus)]
    else:
        matched = matched_drafts(block_list, posterior)
        accepted = matched if r.replay is None else r.replay.accepted(len(s.acceptance), rows, matched)
        new = new_tokens(block_list, posterior, accepted)
    commit_step(engine, s, draft, rows, accepted, new, features)


def commit_step(engine, s, draft, rows: int, accepted: int, new: list, features) -> None:
    """Commits a verify step's decision (`accepted` drafts of a `rows`-row block; `new`: the accepted
    drafts and the bonus): the tokens (room, stop ids), the draft context's features, the stats."""
    produced, s.stopped = commit(new, s.max_length - s.start - 1, set(s.req.stop_ids), s.tokens)
    if engine.recurrent is not None:        # a hybrid target's state: after the anchor and the accepted drafts
        engine.recurrent.commit_step(s.id, produced)
    if features is not None:
        s.ctx.append((features[:produced], s.start))
    s.start += produced
    s.acceptance.append(produced)
    if draft is not None and engine.config.adaptive:     # the adaptive length's labels (adaptive.py)
        engine.estimator.observe(rows - 1, accepted)
