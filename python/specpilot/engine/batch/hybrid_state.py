"""The batched engine's recurrent state for hybrid targets (Gated DeltaNet + gated attention): a pool
of slots, one per running request, holding per GDN layer its conv state [slots, C, K-1] (model dtype)
and recurrent state [slots, H, Dk, Dv] (fp32). The attention layers keep their K/V in the engine's
paged cache as a dense target's.

A request takes a slot at admission (zeroed: a new sequence, nothing of the slot's last request
leaks) and frees it when it leaves. A forward over a request's rows (forward_hybrid.py) reads its
slot's state without writing it and leaves a pending record: per GDN layer the conv window [K-1
previous inputs, T new ones] and the state after each of the T rows (or only after the last, for a
chunked prefill). `commit(request, n)` then makes the state after the record's first n rows the
slot's state: exactly what AR decoding would have reached after those tokens (the single-request
engine's HybridCache.commit, per slot). A prefill chunk commits all its rows at once; a verify
commits its accepted prefix (step.commit_step; with prefix-first, pass 1's rows before pass 2).
"""
from __future__ import annotations

import torch

from specpilot.engine.recurrent_state import MAX_SNAPSHOT_T


EAGER = ("the batched engine runs hybrid recurrent targets eagerly (no CUDA graphs): each request's GDN "
         "recurrence runs from its own state slot, per request")


def unsupported(block_size: int, graph_step_factory: bool) -> str | None:
    """Why the batched engine cannot run this hybrid target set-up (None: it can)."""
    if graph_step_factory:
        return "the batched engine runs hybrid recurrent targets eagerly only: pass no graph_step_factory"
    if block_size > MAX_SNAPSHOT_T:
        return f"block_size={block_size}: hybrid targets keep per-position states of at most {MAX_SNAPSHOT_T} rows"
    return None


class RecurrentSlots:
    def __init__(self, cfg, slots: int, device, dtype):
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.width = cfg.conv_kernel - 1
        self.gdn_index = {layer: j for j, layer in enumerate(cfg.gdn_layers)}
        self.conv = [torch.zeros(slots, cfg.conv_dim, self.width, device=device, dtype=dtype) for _ in cfg.gdn_layers]
        self.state = [torch.zeros(slots, hv, dk, dv, device=device, dtype=torch.float32) for _ in cfg.gdn_layers]
        self._free = list(range(slots - 1, -1, -1))        # pop() hands out low slots first
        self.slot_of = {}                                   # request id -> its slot
        self.pending = {}                                   # request id -> (rows, every, [(window, states)] per layer)
        self.ahead = {}                                     # request id -> rows of this step committed by pass 1

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def step_bytes(self, rows: int, requests: int) -> int:
        """What one step's pending records hold at most, over `rows` rows of `requests` requests: per
        GDN layer and row, the state after it (fp32) and its conv input, and per request the conv's
        K-1 previous inputs; kept off the page pool when that is sized from free memory."""
        total = 0
        for conv, state in zip(self.conv, self.state):
            row_state = state[0].numel() * state.element_size()
            conv_row = conv.shape[1] * conv.element_size()
            total += rows * (row_state + conv_row) + requests * self.width * conv_row
        return total

    def take(self, request_id: int) -> None:
        """A zeroed slot for a new request."""
        if request_id in self.slot_of:
            raise RuntimeError(f"request {request_id} already holds recurrent state slot {self.slot_of[request_id]}")
        if not self._free:
            raise RuntimeError("no free recurrent state slot (the engine admits at most one request per slot)")
        slot = self._free.pop()
        for conv, state in zip(self.conv, self.state):
            conv[slot].zero_()
            state[slot].zero_()
        self.slot_of[request_id] = slot

    def release(self, request_id: int) -> None:
        """The request left: its slot goes back (no-op for a request that never took one)."""
        slot = self.slot_of.pop(request_id, None)
        self.pending.pop(request_id, None)
        self.ahead.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)

    def layer_state(self, request_id: int, layer: int) -> tuple:
        """(conv [1, C, K-1], state [1, H, Dk, Dv]) of the request's slot for GDN layer `layer` (views)."""
        slot, j = self.slot_of[request_id], self.gdn_index[layer]
        return self.conv[j][slot:slot + 1], self.state[j][slot:slot + 1]

    def begin(self, request_id: int, rows: int, every: bool) -> None:
        """Before a forward over `rows` rows of the request (every: it keeps the state after each row)."""
        if request_id in self.pending:
            raise RuntimeError(f"request {request_id}: a forward's recurrent state was never committed "
                               f"before the next forward over its rows")
        self.pending[request_id] = (rows, every, [None] * len(self.conv))

    def keeps_every_row(self, request_id: int) -> bool:
        """Whether the request's pending forward keeps the state after each of its rows."""
        return self.pending[request_id][1]

    def stash(self, request_id: int, layer: int, window: torch.Tensor, states: torch.Tensor) -> None:
        """The forward's conv window [1, C, K-1+T] and states [1, T or 1, H, Dk, Dv] for GDN layer `layer`."""
        self.pending[request_id][2][self.gdn_index[layer]] = (window, states)

    def advance(self, request_id: int, n: int) -> None:
        """Prefix-first's pass 1: its n rows are all committed tokens, so their state is committed now
        (pass 2 continues from it); the step's commit_step counts them."""
        self.commit(request_id, n)
        self.ahead[request_id] = n

    def commit_step(self, request_id: int, produced: int) -> None:
        """After a verify step that produced `produced` tokens: the state after the anchor and the
        accepted drafts (`produced` rows of the step, less those pass 1 committed). Fewer produced
        than pass 1 committed (a stop id inside them) ends the request: its record is dropped."""
        n = produced - self.ahead.pop(request_id, 0)
        if n > 0:
            self.commit(request_id, n)
        else:
            self.discard(request_id)

    def discard(self, request_id: int) -> None:
        """Drops the pending forward uncommitted (the slot's state stays as it was)."""
        self.pending.pop(request_id)

    def commit(self, request_id: int, n: int) -> None:
        """The state after the pending forward's first n rows becomes the slot's state."""
        if request_id not in self.pending:
            raise RuntimeError(f"request {request_id}: no pending forward to commit {n} rows of")
        rows, every, layers = self.pending.pop(request_id)
        if not 0 < n <= rows or (not every and n != rows):
            raise RuntimeError(f"request {request_id}: cannot commit {n} rows of a {rows}-row forward"
                               + ("" if every else " that kept only its final state"))
        slot = self.slot_of[request_id]
        for conv, state, (window, states) in zip(self.conv, self.state, layers):
            conv[slot].copy_(window[0, :, n:n + self.width])
            state[slot].copy_(states[0, n - 1 if every else 0])
