"""Paged KV caches for the batched engine: one page pool shared by the target and drafter caches.

Layout: per layer one K and one V tensor [1, H_kv, pages * page_size, D] (the static cache's layout
with the batch axis folded into the slot axis). A request owns a page list (its block table);
logical position p lives at physical slot table[p // page_size] * page_size + p % page_size, in the
target cache and in the drafter cache alike (both pools have the same page count), so one table
serves both. A request reserves every page it can ever touch at admission (prompt + max_new_tokens
positions), so a running request never waits for memory and nothing is ever preempted; its pages
return to the pool when it finishes, fails or is cancelled.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch


class PagePool:
    """Free-list allocator of page indices."""

    def __init__(self, num_pages: int):
        if num_pages < 1:
            raise ValueError(f"the KV page pool needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))      # pop() hands out low pages first
        self._taken = set()                                  # a release costs its own pages, not the pool's

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list | None:
        """n pages, or None when fewer are free (nothing is taken then)."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        self._taken.update(pages)
        return pages

    def release(self, pages: list) -> None:
        if not self._taken.issuperset(pages):
            raise RuntimeError(f"pages {sorted(set(pages) - self._taken)[:5]} released twice")
        self._taken.difference_update(pages)
        self._free.extend(reversed(pages))


class PagedKV:
    """K/V of one model over `num_pages` pages: .k[i] / .v[i] [1, H_kv, num_pages * page_size, D]."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, num_pages: int, page_size: int, device, dtype):
        shape = (1, kv_heads, num_pages * page_size, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def kv_layers(target) -> int:
    """The target's layers that keep K/V (a hybrid's GDN layers keep a recurrent state instead)."""
    c = target.config
    return len(c.attention_layers) if getattr(target, "is_hybrid", False) else c.num_layers


def page_bytes(target, drafter, page_size: int) -> int:
    """Bytes one page costs across the target cache and (if any) the drafter cache."""
    c = target.config
    per_slot = 2 * kv_layers(target) * c.num_kv_heads * c.head_dim
    if drafter is not None:
        d = drafter.config
        per_slot += 2 * d.num_layers * d.num_kv_heads * d.head_dim
    return per_slot * page_size * torch.empty((), dtype=target.dtype).element_size()


def pages_for(target, drafter, page_size: int, kv_pages, memory_fraction, reserved_bytes: int = 0) -> int:
    """The pool size: `kv_pages` when given, else `memory_fraction` of the device's free memory less
    `reserved_bytes` (what the steps allocate besides the pages; CUDA only: on the CPU the page count
    must be explicit)."""
    if (kv_pages is None) == (memory_fraction is None):
        raise ValueError("give exactly one of kv_pages (a page count) or memory_fraction (of free GPU memory)")
    if kv_pages is not None:
        if isinstance(kv_pages, bool) or not isinstance(kv_pages, int) or kv_pages < 1:
            raise ValueError(f"kv_pages={kv_pages!r} must be a positive int")
        return kv_pages
    if not 0 < memory_fraction < 1:
        raise ValueError(f"memory_fraction={memory_fraction} must be in (0, 1)")
    device = target.device
    if device.type != "cuda":
        raise ValueError(f"memory_fraction sizes the cache from free GPU memory; on {device.type} give kv_pages")
    free, _ = torch.cuda.mem_get_info(device)
    pages = (int(free * memory_fraction) - reserved_bytes) // page_bytes(target, drafter, page_size)
    if pages < 1:
        less = f", less {reserved_bytes / 2**30:.2f} GiB the steps need," if reserved_bytes else ""
        raise ValueError(f"memory_fraction={memory_fraction} of {free / 2**30:.2f} GiB free{less} holds no KV page")
    return pages


# A position's physical slot is table[position // page_size] * page_size + position % page_size. The
# helpers below lay out a whole step's requests in a few array ops: a per-request call costs more host
# time than its arithmetic at a few dozen requests.

def stack_tables(tables: list, ends: np.ndarray, page_size: int, fill: int = 0, width: int = 0) -> np.ndarray:
    """Requests' page tables (lists of host ints) as one int64 array [R, max(width, longest)], each row
    padded with `fill` past its own table. ends [R]: the last position each request reads or writes,
    which its own table must hold (table_slots would read the padding silently)."""
    lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    short = ends // page_size >= lengths
    if short.any():
        r = int(np.argmax(short))
        raise IndexError(f"request {r}: position {ends[r]} is past its page table of {lengths[r]} pages")
    flat = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int64, count=int(lengths.sum()))
    width = max(width, int(lengths.max(initial=0)))
    table = np.full((len(tables), width), fill, dtype=np.int64)
    table[np.arange(width) < lengths[:, None]] = flat
    return table


def table_slots(table: np.ndarray, requests: np.ndarray, positions: np.ndarray, page_size: int) -> np.ndarray:
    """Slots over many requests: the slot of position positions[i] under page table table[requests[i]]
    (table [R, P] from stack_tables; requests and positions broadcast together)."""
    return table[requests, positions // page_size] * page_size + positions % page_size


def key_slots(table: np.ndarray, ends: np.ndarray, keys: int, page_size: int) -> np.ndarray:
    """[R, keys]: row r the slots of key positions 0..keys-1 under page table table[r] (from
    stack_tables, so that it holds ends[r]), positions past ends[r] reading the slot of ends[r]: per
    request the slots of np.minimum(np.arange(keys), end). Built page by page (no division per key);
    only the keys between the shortest and the longest request's end need a per-key test."""
    r = table.shape[0]
    lo, hi = min(int(ends.min()) + 1, keys), min(int(ends.max()) + 1, keys)
    pages = -(-hi // page_size)
    last = (table[np.arange(r), ends // page_size] * page_size + ends % page_size)[:, None]
    slots = np.empty((r, keys), dtype=np.int64)
    slots[:, :hi] = ((table[:, :pages] * page_size)[:, :, None] + np.arange(page_size)).reshape(r, -1)[:, :hi]
    slots[:, hi:] = last
    np.copyto(slots[:, lo:hi], last, where=np.arange(lo, hi) > ends[:, None])
    return slots
