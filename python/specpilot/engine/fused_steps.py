"""Whole decode steps as one (CUDA-graphed) call each: the greedy AR step and the greedy DFlash step.

Why: on a small target the separate draft / verify graphs plus the eager glue between them (index
building, argmax, cat, clone, several host syncs) cost more than the model itself. Here every
per-step index is computed on the device from a few scalars in one int64 control buffer, so a
step is: one graph replay and one device->host copy of its packed result into pinned memory (the
only host sync); the host uploads control scalars only to start a generation (or, with early launch
off, before every step).

Greedy DFlash step (block B, kv span S), control = CONTROL (int64, on the device):
  1. draft context: the target features of the last step's committed rows (`ctx_count` rows at
     positions ctx_start..) -> draft cache; padding rows -> the trash slot.
  2. draft block [anchor, mask x (B-1)] at positions start.. (rows >= vs, the tail padding, sit
     at the trash slot and are invisible: keys visible iff slot <= start + vs - 1), argmax.
     Replay (timing tier, `replay` = 1) overrides the drafts with row `step` of a table the host
     filled before the clock (load_plan: AcceptanceReplay.device_plan's drafts and planned counts
     for every step; a replayed generation's positions do not depend on the model).
  3. verify [anchor, drafts] with the target (causal; padding rows at the trash slot), argmax,
     accepted-prefix length over the vs - 1 real drafts, features -> the context buffer.
  4. the next step's control, by the rule of accept.py (the planned count under replay; a stop
     token is the host's to see).
  Output (int64 [2 + 2B]): [matched, block x B, posterior x B, start].
So the host can launch the next step as soon as it has read this one's output and seen no stop
(EngineConfig.early_launch): no control upload on the critical path.
Exactness: the same arithmetic as the stepwise path (steps.py); a tail block (vs < B) runs padded
to B rows, so its real rows differ from stock's vs-row block only by kernel rounding (masked keys
add exact zeros; GEMM row count may change the GEMM kernel).

AR step (span S): [token, position] buffers -> target at that position -> argmax written back into
the token buffer, position + 1 (the graph advances itself; the host only reads the token). With
early launch the host keeps one step in flight: it launches token k+1 before reading token k, so
the GPU never waits for the host; a stop token costs one step already launched.
"""
from __future__ import annotations

import collections

import torch

from . import step_kernels
from .step_kernels import ANCHOR, CONTROL, START


class _Readback:
    """A replay's packed output copied into pinned memory, and the event that says it is there."""

    def __init__(self, size: int, device):
        pin = device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=pin)
        self.event = torch.cuda.Event() if pin else None

    def fetch(self, out: torch.Tensor) -> "_Readback":
        self.host.copy_(out, non_blocking=self.event is not None)
        if self.event is not None:
            self.event.record()
        return self

    def values(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


class FusedSteps:
    def __init__(self, forwards, cache, draft_cache, drafter, dtype, feature_width: int, use_graphs: bool,
                 step_factory, pool, step_kernels: bool, kv_buckets):
        """forwards: steps.StepForwards (the model calls); cache / draft_cache: the engine's KV caches
        (draft_cache None without a drafter); feature_width: the drafter's context features;
        step_kernels: EngineConfig.step_kernels; kv_buckets: the runner's graphs.KVBuckets."""
        self.forwards, self.drafter, self.step_kernels, self.kv_buckets = forwards, drafter, step_kernels, kv_buckets
        self.cache, self.capacity, self.trash = cache, cache.slots, cache.trash_slot
        if draft_cache is not None and draft_cache.trash_slot != self.trash:
            raise RuntimeError(f"target / draft caches differ in slots ({self.trash} vs {draft_cache.trash_slot})")
        self.dtype, self.feature_width = dtype, feature_width
        self.use_graphs, self.step_factory, self.pool = use_graphs, step_factory, pool
        device = cache.k[0].device
        self.device = device
        self.graphs = {}                                        # ("ar", span) / ("spec", B, span) -> step
        self.ar_token = torch.zeros(1, dtype=torch.long, device=device)       # [1]
        self.ar_pos = torch.zeros(1, dtype=torch.long, device=device)         # [1]
        self.ar_ring = [_Readback(1, device) for _ in range(2)]               # AR: one step in flight
        self.ar_pending = collections.deque()                                 # launched, not yet read
        self.ar_launched = 0
        self.ctl = torch.zeros(len(CONTROL), dtype=torch.long, device=device)
        self.ctl_host = torch.zeros(len(CONTROL), dtype=torch.long, pin_memory=device.type == "cuda")
        self.ctx_feats = {}                                     # B -> [1, B, F] features for the next draft
        self.spec_out = {}                                      # B -> _Readback of [2 + 2B]
        self.replay_drafts = {}                                 # B -> [steps, B-1]: replay's drafts per step
        self.replay_accepted = {}                               # B -> [steps]: replay's accepted drafts
        self.tree_out = {}                                      # (B, N) -> _Readback of [3 + B] (tree/fused.py)

    # -- buffers --------------------------------------------------------------------------------
    def _spec_buffers(self, b: int):
        if b not in self.ctx_feats:
            self.ctx_feats[b] = torch.zeros(1, b, self.feature_width, dtype=self.dtype, device=self.device)
            self.spec_out[b] = _Readback(2 + 2 * b, self.device)
            steps = self.capacity + 1                           # a step makes at least one token
            self.replay_drafts[b] = torch.zeros(steps, b - 1, dtype=torch.long, device=self.device)
            self.replay_accepted[b] = torch.zeros(steps, dtype=torch.long, device=self.device)
        return self.ctl, self.ctx_feats[b]

    def _send(self, **values) -> None:
        """Every control scalar, by name, to the device (stream-ordered before the next replay)."""
        if set(values) != set(CONTROL):
            raise ValueError(f"control needs exactly {CONTROL}, got {sorted(values)}")
        self.ctl_host.copy_(torch.tensor([int(values[name]) for name in CONTROL], dtype=torch.long))
        self.ctl.copy_(self.ctl_host, non_blocking=True)

    # -- the step functions (traced once per span when graphed) ---------------------------------
    def _ar_fn(self, span: int):
        def fn():
            logits, _ = self.forwards.target(self.ar_token.view(1, 1), self.ar_pos, span, False)  # [1, 1, V]
            self.ar_token.copy_(torch.argmax(logits[0, -1], dim=-1).view(1))
            self.ar_pos.add_(1)
            return self.ar_token
        return fn

    def _spec_fn(self, b: int, span: int):
        ctl, feats = self._spec_buffers(b)
        forwards, trash, kernels = self.forwards, self.trash, self.step_kernels
        replay_drafts, replay_accepted = self.replay_drafts[b], self.replay_accepted[b]
        # Constants and outputs, made outside the graph: row indices, [anchor, mask ...], the
        # verify block, its argmaxes, the packed output, the accept kernel's counter.
        rows = torch.arange(b, device=self.device)
        mask_block = torch.full((1, b), self.drafter.mask_token_id, dtype=torch.long, device=self.device)
        block = torch.zeros(b, dtype=torch.long, device=self.device)
        posterior = torch.zeros(b, dtype=torch.long, device=self.device)
        out = torch.zeros(2 + 2 * b, dtype=torch.long, device=self.device)
        counter = torch.zeros(1, dtype=torch.int32, device=self.device)

        def fn():
            start, ctx_start, ctx_count, vs, anchor = (ctl[i:i + 1] for i in range(START, ANCHOR + 1))
            ctx_pos = torch.where(rows < ctx_count, ctx_start + rows, trash)         # [B]
            blk_pos = torch.where(rows < vs, start + rows, trash)                    # [B]
            mask_block[:, :1].copy_(anchor.view(1, 1))                               # [1, B]: anchor, masks
            forwards.write_context(feats, ctx_pos)
            draft_logits = forwards.draft(mask_block, blk_pos, span, start + vs - 1)  # [1, B-1, V]
            step_kernels.pick_drafts(draft_logits[0], ctl, replay_drafts, block, kernels)    # [anchor, drafts]
            logits, new_feats = forwards.target(block.view(1, b), blk_pos, span, True)  # [1, B, V], [1, B, F]
            feats.copy_(new_feats)
            step_kernels.accept_block(logits[0], block, replay_accepted, ctl, posterior, out, counter, kernels)
            return out                                                               # [2 + 2B]
        return fn

    # -- graphs ---------------------------------------------------------------------------------
    def _step(self, key, make_fn):
        step = self.graphs.get(key)
        if step is None:
            # A capture's warm-up calls execute the step: keep the state they advance or overwrite
            # (the K/V they write are the values the real step writes), so a capture mid-generation
            # is safe too.
            state = [self.ar_token, self.ar_pos, self.ctl, *self.ctx_feats.values()]
            saved = [t.clone() for t in state]
            step = self.step_factory(make_fn(), (), self.pool)
            for t, s in zip(state, saved):
                t.copy_(s)
            self.graphs[key] = step
        return step

    def capture_all(self, block_size: int | None, tree_budget: int = 0) -> int:
        """Captures the AR step (and the spec step for `block_size` > 1, and the tree step of
        `tree_budget` nodes when given) for every kv span, with scratch control values (writes land in
        slots 0..max(B, N)-1, rewritten by the next prefill or written before they are read).
        Must run outside a generation: a capture's warm-up calls execute the step."""
        if not self.use_graphs:
            return 0
        spec = block_size is not None and block_size > 1 and self.drafter is not None
        from .tree.build import fills_budget
        tree = spec and tree_budget > 0 and fills_budget(self.drafter.target.config.vocab_size, tree_budget)
        spans = self.kv_buckets.spans()
        wanted = [("ar", s) for s in spans] + ([("spec", block_size, s) for s in spans] if spec else [])
        wanted += [("tree", block_size, tree_budget, s) for s in spans if s >= tree_budget] if tree else []
        if all(k in self.graphs for k in wanted):
            return len(self.graphs)                             # the per-generation call: nothing to do
        for span in spans:
            self.ar_pos.fill_(0)
            self._step(("ar", span), lambda: self._ar_fn(span))
            if spec:
                self._spec_buffers(block_size)
                self._send(start=0, ctx_start=0, ctx_count=0, vs=block_size, anchor=0, replay=0,
                           max_length=block_size + 1, step=0)
                self._step(("spec", block_size, span), lambda: self._spec_fn(block_size, span))
            if tree and span >= tree_budget:
                from .tree.fused import tree_step_fn
                self._send(start=0, ctx_start=0, ctx_count=0, vs=block_size, anchor=0, replay=0,
                           max_length=block_size + 1, step=0)
                self._step(("tree", block_size, tree_budget, span), lambda: tree_step_fn(self, block_size, tree_budget, span))
        return len(self.graphs)

    # -- AR (host side) -------------------------------------------------------------------------
    def ar_begin(self, token: int, position: int) -> None:
        """The next AR step feeds `token` at `position`."""
        self.ar_token.fill_(int(token))
        self.ar_pos.fill_(int(position))
        self.ar_pending.clear()
        self.ar_launched = int(position)

    def ar_launch(self) -> None:
        """Launches the next AR step (at the position after the last one launched)."""
        if len(self.ar_pending) == len(self.ar_ring):
            raise RuntimeError(f"ar_launch: {len(self.ar_ring)} AR steps already in flight")
        span = self.kv_buckets.span(self.ar_launched + 1)
        if self.use_graphs:
            out = self._step(("ar", span), lambda: self._ar_fn(span))()
        else:
            out = self._ar_fn(self.ar_launched + 1)()
        slot = self.ar_ring[self.ar_launched % len(self.ar_ring)]
        self.ar_pending.append(slot.fetch(out))
        self.ar_launched += 1

    def ar_collect(self) -> int:
        """The token of the oldest AR step in flight (waits for it)."""
        return self.ar_pending.popleft().values()[0]

    def ar_step(self, position: int) -> int:
        """One greedy AR step at `position` (must be the position ar_begin / the last step left)."""
        if position != self.ar_launched or self.ar_pending:
            raise RuntimeError(f"ar_step at {position}: the graph's position is {self.ar_launched}"
                               f" with {len(self.ar_pending)} step(s) in flight")
        self.ar_launch()
        return self.ar_collect()

    # -- spec (host side) -----------------------------------------------------------------------
    def write_prompt_context(self, features) -> None:
        """Draft context for the whole prompt (features [1, n, F] at positions 0..n-1), eagerly."""
        self.forwards.write_context(features, torch.arange(features.shape[1], device=features.device))

    def load_plan(self, policy, b: int, prompt_len: int, max_length: int) -> None:
        """A replaying policy's drafts and planned accepted counts for every step of a generation
        (prompt_len -> max_length) to the device, before its clock starts; nothing for GREEDY."""
        if not policy.replays:
            return
        self._spec_buffers(b)
        drafts, accepted = policy.device_plan(b, prompt_len, max_length, self.drafter.target.config.vocab_size)
        self.replay_drafts[b][:len(drafts)].copy_(drafts)
        self.replay_accepted[b][:len(accepted)].copy_(accepted)

    def spec_send(self, b: int, start: int, ctx_start: int, ctx_count: int, anchor: int, max_length: int,
                  step: int, replay: bool) -> None:
        """Every control scalar of one spec step, from the host's own bookkeeping (a generation's
        first step: no context rows, its prompt already in the draft cache, step 0)."""
        self._spec_buffers(b)
        self._send(start=start, ctx_start=ctx_start, ctx_count=ctx_count, vs=min(b, max_length - start),
                   anchor=anchor, replay=bool(replay), max_length=max_length, step=step)

    def spec_launch(self, b: int, span_end: int) -> _Readback:
        """Replays the spec step for the control now on the device; span_end = start + vs of that
        step (the host's count), which picks the kv span. Read the result with `.values()`."""
        if self.use_graphs:
            span = self.kv_buckets.span(span_end)
            out = self._step(("spec", b, span), lambda: self._spec_fn(b, span))()
        else:
            out = self._spec_fn(b, span_end)()
        return self.spec_out[b].fetch(out)

    def tree_launch(self, b: int, n: int, start: int) -> _Readback:
        """Replays the tree step (tree/fused.py) of n nodes for the control now on the device, whose
        anchor sits at `start` (the host's count: its n scratch slots and block pick the kv span)."""
        from .tree.fused import tree_step_fn

        if (b, n) not in self.tree_out:
            self.tree_out[(b, n)] = _Readback(3 + b, self.device)
        end = start + max(b, n)
        if self.use_graphs:
            span = self.kv_buckets.span(end)
            out = self._step(("tree", b, n, span), lambda: tree_step_fn(self, b, n, span))()
        else:
            out = tree_step_fn(self, b, n, end)()
        return self.tree_out[(b, n)].fetch(out)

    def spec_step(self, b: int, start: int, ctx_start: int, ctx_count: int, vs: int, anchor: int) -> list:
        """One greedy DFlash step from explicit control values (no replay); returns
        [matched, block x B, posterior x B, start] as ints."""
        if not 2 <= vs <= b:
            raise ValueError(f"spec_step: verify size {vs} must be in [2, block {b}]")
        self._spec_buffers(b)
        self._send(start=start, ctx_start=ctx_start, ctx_count=ctx_count, vs=vs, anchor=anchor, replay=0,
                   max_length=start + vs + 1, step=0)
        return self.spec_launch(b, start + vs).values()
