"""The batched engine's per-step host arrays, built with array ops over all requests at once
(engine/batch/forward.py: padded, Layout, block_last, block_keep; paged.py's many-request slot
helpers; step._block_sources; AcceptanceReplay.drafts), equal a straightforward per-request
construction (the references below) on random inputs."""
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from test_engine_helpers import fresh_seed
from specpilot.engine.batch import forward, step
from specpilot.engine.replay import AcceptanceReplay


def slots_of(pages, positions, page_size):
    """One request's slots of `positions` under its page table."""
    return np.asarray(pages, dtype=np.int64)[positions // page_size] * page_size + positions % page_size


def reference_padded(segments, requests, rows, keys, page_size, trash_slot, last=None, paged=False):
    """forward.padded, one request at a time."""
    trash_page = trash_slot // page_size
    positions = np.zeros((requests, rows), dtype=np.int64)
    slots = np.full((requests, rows), trash_slot, dtype=np.int64)
    if paged:
        key_array = np.full((requests, keys // page_size), trash_page, dtype=np.int64)
    else:
        key_array = np.full((requests, keys), trash_slot, dtype=np.int64)
    padded_last = np.zeros((requests, rows), dtype=np.int64)
    at, key_range = 0, np.arange(keys)
    for r, s in enumerate(segments):
        pos = np.arange(s.start, s.start + s.rows, dtype=np.int64)
        own_last = pos if last is None else np.asarray(last[at:at + s.rows], dtype=np.int64)
        at += s.rows
        positions[r, :s.rows], positions[r, s.rows:] = pos, pos[-1]
        slots[r, :s.rows] = slots_of(s.pages, pos, page_size)
        padded_last[r, :s.rows], padded_last[r, s.rows:] = own_last, own_last[-1]
        if paged:
            table = s.pages[:key_array.shape[1]]
            key_array[r, :len(table)] = table
        else:
            key_array[r] = slots_of(s.pages, np.minimum(key_range, s.start + s.rows - 1), page_size)
    return [positions.ravel(), slots.ravel(), key_array, padded_last]


def reference_layout(segments, page_size, last=None):
    """Layout's host arrays (positions, slots, q_index, kv_index, out_index, padded_last), one request
    at a time."""
    pos = [np.arange(s.start, s.start + s.rows, dtype=np.int64) for s in segments]
    positions = np.concatenate(pos)
    slots = np.concatenate([slots_of(s.pages, p, page_size) for s, p in zip(segments, pos)])
    bounds = np.cumsum([0] + [s.rows for s in segments])
    max_rows = max(s.rows for s in segments)
    max_keys = -(-max(s.start + s.rows for s in segments) // forward.KEY_PAD) * forward.KEY_PAD
    rows, keys = np.arange(max_rows), np.arange(max_keys)
    q_index = np.stack([b + np.minimum(rows, s.rows - 1) for b, s in zip(bounds, segments)])
    kv_index = np.stack([slots_of(s.pages, np.minimum(keys, s.start + s.rows - 1), page_size) for s in segments])
    out_index = np.concatenate([i * max_rows + np.arange(s.rows) for i, s in enumerate(segments)])
    last = positions if last is None else np.asarray(last, dtype=np.int64)
    return [positions, slots, q_index, kv_index, out_index, last[q_index]]


def random_segments(rng, count, max_rows, page_size, pool_pages):
    """`count` segments of 1..max_rows rows, each over a page table of its own (distinct pages of a
    pool, the table a few pages longer than its rows need, or exactly as long)."""
    pages = rng.permutation(pool_pages).tolist()
    segments = []
    for _ in range(count):
        rows = int(rng.integers(1, max_rows + 1))
        start = int(rng.integers(0, 6 * page_size))
        need = -(-(start + rows) // page_size)
        table, pages = pages[:need + int(rng.integers(0, 3))], pages[need + 3:]
        segments.append(forward.Segment(table, start, rows))
    return segments


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("with_last", [False, True])
def test_padded_equals_per_request(page_size, paged, with_last):
    rng = np.random.default_rng(fresh_seed())
    pool_pages = 40 * (16 // page_size + 7)
    trash_slot = pool_pages * page_size
    for count in [0, 1, 3, 8, 13]:
        rows = int(rng.integers(1, 9))
        segments = random_segments(rng, count, rows, page_size, pool_pages)
        requests = count + int(rng.integers(0, 4))
        need = max((s.start + s.rows for s in segments), default=1)
        keys = -(-need // 64) * 64 * int(rng.integers(1, 3))
        last = None
        if with_last and segments:      # block_last, or any last >= each row's position
            last = (forward.block_last(segments) if rng.integers(2) else
                    np.concatenate([np.arange(s.start, s.start + s.rows) + rng.integers(0, 3, s.rows) for s in segments]))
        got = forward.padded(segments, requests, rows, keys, page_size, trash_slot, last, paged)
        want = reference_padded(segments, requests, rows, keys, page_size, trash_slot, last, paged)
        for g, w in zip(got, want):
            assert g.dtype == np.int64 and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("with_last", [False, True])
def test_layout_equals_per_request(page_size, with_last):
    rng = np.random.default_rng(fresh_seed())
    pool_pages = 40 * (16 // page_size + 7)
    staging = forward.Staging("cpu")
    for count in [1, 2, 5, 17]:
        segments = random_segments(rng, count, int(rng.integers(1, 20)), page_size, pool_pages)
        last = forward.block_last(segments) if with_last else None
        extra = [np.arange(7)]
        layout = forward.Layout(segments, page_size, staging, last=last, extra=extra)
        want = reference_layout(segments, page_size, last)
        got = [layout.positions, layout.slots, layout.q_index, layout.kv_index, layout.out_index, layout.padded_last]
        for g, w in zip(got, want):
            assert g.dtype == torch.int64
            np.testing.assert_array_equal(g.numpy(), w)
        assert layout.max_rows == max(s.rows for s in segments) and layout.max_keys == want[3].shape[1]
        np.testing.assert_array_equal(layout.extra[0].numpy(), extra[0])


def test_block_rows_equal_per_request():
    rng = np.random.default_rng(fresh_seed())
    segments = random_segments(rng, 11, 9, 4, 400)
    bounds = np.cumsum([0] + [s.rows for s in segments])
    np.testing.assert_array_equal(forward.block_last(segments), np.concatenate(
        [np.full(s.rows, s.start + s.rows - 1) for s in segments]))
    np.testing.assert_array_equal(forward.block_keep(segments), np.concatenate(
        [np.arange(a + 1, b) for a, b in zip(bounds[:-1], bounds[1:])]))


def test_layouts_refuse_positions_past_the_page_table():
    segments = [forward.Segment([3, 5], 0, 4), forward.Segment([7], 14, 3)]       # page 7 holds 0..7 only
    with pytest.raises(IndexError, match="past its page table"):
        forward.padded(segments, 2, 4, 64, 8, 800)
    with pytest.raises(IndexError, match="past its page table"):
        forward.Layout(segments, 8, forward.Staging("cpu"))
    with pytest.raises(ValueError, match="at least one segment"):
        forward.Layout([forward.Segment([3], 0, 0)], 8, forward.Staging("cpu"))


def reference_blocks(group, segments, offsets, draft_rows, total, mask_id, vocab, drafter_rows):
    """(block ids in, the blocks assembled) of step._block_sources, one request at a time: block row 0
    the anchor, then a replay's planned drafts or the drafter's rows (draft_rows[r] + j)."""
    block_in = np.full(total, mask_id, dtype=np.int64)
    blocks = np.zeros(total, dtype=np.int64)
    blocks[:] = group[0].tokens[-1]                       # padding rows: host token 0, the first anchor
    for s, seg, off, row in zip(group, segments, offsets, draft_rows):
        k = seg.rows - 1
        block_in[off] = blocks[off] = s.tokens[-1]
        if s.req.replay is not None:
            blocks[off + 1:off + 1 + k] = s.req.replay.planned_drafts(len(s.acceptance), s.start - s.prompt_len, k, vocab)
        else:
            blocks[off + 1:off + 1 + k] = drafter_rows[row:row + k]
    return block_in, blocks


@pytest.mark.parametrize("padded", [False, True])
def test_block_sources_equal_per_request(padded):
    rng = random.Random(fresh_seed())
    vocab, block = 50, 6
    engine = SimpleNamespace(drafter=SimpleNamespace(mask_token_id=vocab - 1, config=SimpleNamespace(vocab_size=vocab)))
    for _ in range(20):
        group, segments = [], []
        for _ in range(rng.randint(1, 9)):
            prompt_len, done = rng.randint(1, 9), rng.randint(0, 30)
            replay = (AcceptanceReplay([rng.randrange(vocab) for _ in range(rng.randint(1, 40))], rng.uniform(1, 5))
                      if rng.random() < 0.5 else None)
            group.append(SimpleNamespace(tokens=[rng.randrange(vocab) for _ in range(done + 1)], prompt_len=prompt_len,
                                         start=prompt_len + done, acceptance=[1] * rng.randint(0, 9),
                                         req=SimpleNamespace(replay=replay)))
            segments.append(forward.Segment([], 0, rng.randint(1, block)))
        if padded:          # the graphed draft's layout: request r's block at r * block, padding between
            offsets, draft_rows = [r * block for r in range(len(group))], [r * (block - 1) for r in range(len(group))]
            total = (len(group) + rng.randint(0, 3)) * block
        else:
            offsets = np.cumsum([0] + [seg.rows for seg in segments])[:-1].tolist()
            draft_rows = np.cumsum([0] + [seg.rows - 1 for seg in segments])[:-1].tolist()
            total = sum(seg.rows for seg in segments)
        drafter_rows = np.asarray([rng.randrange(vocab) for _ in range(total)], dtype=np.int64)
        block_in, host_tokens, source = step._block_sources(engine, group, segments, offsets, draft_rows, total)
        want_in, want_blocks = reference_blocks(group, segments, offsets, draft_rows, total, vocab - 1, vocab, drafter_rows)
        np.testing.assert_array_equal(block_in, want_in)
        np.testing.assert_array_equal(np.concatenate([host_tokens, drafter_rows])[source], want_blocks)


def test_replay_drafts_equal_token_by_token():
    rng = random.Random(fresh_seed())
    for _ in range(300):
        vocab = rng.randint(1, 6)
        replay = AcceptanceReplay([rng.randrange(vocab) for _ in range(rng.randint(1, 12))], 2.0)
        new_index, accept, count = rng.randint(0, 14), rng.randint(0, 8), rng.randint(0, 8)
        want = []
        for j in range(count):          # the rule token by token
            pos = new_index + 1 + j
            token = replay.transcript[pos] if pos < len(replay.transcript) else None
            want.append(token if j < accept and token is not None else ((token if token is not None else 0) + 1) % vocab)
        assert replay.drafts(new_index, accept, count, vocab) == want
