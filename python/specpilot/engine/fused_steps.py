"""Whole decode steps as one (CUDA-graphed) call each: the greedy AR step and the greedy DFlash step.

Why: on a small target the separate draft / verify graphs plus the eager glue between them (index
building, argmax, cat, clone, several host syncs) cost more than the model itself. Here every
per-step index is computed on the device from a few scalars in one int64 control buffer, so a
step is: one host->device copy of the control scalars, one graph replay, one device->host copy of
the packed result (the only host sync).

Greedy DFlash step (block B, kv span S), control = [start, ctx_start, ctx_count, vs, anchor,
use_forced, forced drafts x (B-1)]:
  1. draft context: the target features of the last step's committed rows (`ctx_count` rows at
     positions ctx_start..) -> draft cache; padding rows -> the trash slot.
  2. draft block [anchor, mask x (B-1)] at positions start.. (rows >= vs, the tail padding, sit
     at the trash slot and are invisible: keys visible iff slot <= start + vs - 1), argmax.
     Replay (timing tier) overrides the drafts with `forced` when use_forced.
  3. verify [anchor, drafts] with the target (causal; padding rows at the trash slot), argmax,
     accepted-prefix length over the vs - 1 real drafts, features -> the context buffer.
  Output (int64 [1 + 2B]): [matched, block x B, posterior x B].
Exactness: the same arithmetic as the stepwise path (steps.py); a tail block (vs < B) runs padded
to B rows, so its real rows differ from stock's vs-row block only by kernel rounding (masked keys
add exact zeros; GEMM row count may change the GEMM kernel).

AR step (span S): [token, position] buffers -> target at that position -> argmax written back into
the token buffer, position + 1 (the graph advances itself; the host only reads the token).
"""
from __future__ import annotations

import torch

from .graphs import kv_bucket


class FusedSteps:
    def __init__(self, runner):
        self.runner = runner
        self.target, self.drafter = runner.target, runner.drafter
        device = self.target.device
        self.device = device
        self.graphs = {}                                        # ("ar", span) / ("spec", B, span) -> step
        self.ar_token = torch.zeros(1, dtype=torch.long, device=device)       # [1]
        self.ar_pos = torch.zeros(1, dtype=torch.long, device=device)         # [1]
        self.ctl = {}                                           # B -> int64 [6 + B - 1] (device)
        self.ctl_host = {}                                      # B -> pinned host twin
        self.ctx_feats = {}                                     # B -> [1, B, F] features for the next draft

    # -- buffers --------------------------------------------------------------------------------
    def _host_buffer(self, n: int) -> torch.Tensor:
        pin = self.device.type == "cuda"
        return torch.zeros(n, dtype=torch.long, pin_memory=pin)

    def _spec_buffers(self, b: int):
        if b not in self.ctl:
            self.ctl[b] = torch.zeros(6 + b - 1, dtype=torch.long, device=self.device)
            self.ctl_host[b] = self._host_buffer(6 + b - 1)
            f = len(self.runner.feature_layers) * self.target.config.hidden_size
            self.ctx_feats[b] = torch.zeros(1, b, f, dtype=self.target.dtype, device=self.device)
        return self.ctl[b], self.ctx_feats[b]

    def _send(self, b: int, values) -> None:
        host = self.ctl_host[b]
        host.copy_(torch.tensor(values, dtype=torch.long))
        self.ctl[b].copy_(host, non_blocking=True)             # stream-ordered before the replay

    # -- the step functions (traced once per span when graphed) ---------------------------------
    def _ar_fn(self, span: int):
        def fn():
            runner = self.runner
            with runner.compiled_ctx(self.target):
                logits, _ = runner._target(self.ar_token.view(1, 1), self.ar_pos, span, False)  # [1, 1, V]
            self.ar_token.copy_(torch.argmax(logits[0, -1], dim=-1).view(1))
            self.ar_pos.add_(1)
            return self.ar_token
        return fn

    def _spec_fn(self, b: int, span: int):
        ctl, feats = self._spec_buffers(b)
        runner, drafter = self.runner, self.drafter
        trash = runner.draft_cache.trash_slot
        if runner.cache.trash_slot != trash:
            raise RuntimeError(f"target / draft caches differ in slots ({runner.cache.trash_slot} vs {trash})")

        def fn():
            start, ctx_start, ctx_count, vs, anchor, use_forced = (ctl[i:i + 1] for i in range(6))
            forced = ctl[6:]                                                         # [B-1]
            rows = torch.arange(b, device=ctl.device)                                # [B]
            ctx_pos = torch.where(rows < ctx_count, ctx_start + rows, trash)         # [B]
            blk_pos = torch.where(rows < vs, start + rows, trash)                    # [B]
            mask_ids = torch.full((b - 1,), drafter.mask_token_id, dtype=torch.long, device=ctl.device)
            with runner.compiled_ctx(drafter), runner.kernel_ctx(b):   # (the LM head is the target's)
                drafter.write_context(feats, ctx_pos, runner.draft_cache)
                block = torch.cat([anchor, mask_ids]).view(1, b)                     # [1, B]
                draft_logits = drafter.forward_block(block, blk_pos, runner.draft_cache, span,
                                                     last_visible=start + vs - 1)    # [1, B-1, V]
            drafts = torch.argmax(draft_logits[0], dim=-1)                           # [B-1]
            drafts = torch.where(use_forced > 0, forced, drafts)
            block = torch.cat([anchor, drafts]).view(1, b)                           # [1, B]
            with runner.compiled_ctx(self.target):
                logits, new_feats = runner._target(block, blk_pos, span, True)       # [1, B, V], [1, B, F]
            posterior = torch.argmax(logits[0], dim=-1)                              # [B]
            ok = (drafts == posterior[:-1]) & (rows[:-1] + 1 < vs)                   # real drafts only
            matched = ok.long().cumprod(dim=0).sum(dim=0, keepdim=True)              # [1]
            feats.copy_(new_feats)
            return torch.cat([matched, block[0], posterior])                         # [1 + 2B]
        return fn

    # -- graphs ---------------------------------------------------------------------------------
    def spans(self):
        capacity = self.runner.capacity
        return sorted({kv_bucket(n, capacity) for n in range(1, capacity + 1, 128)} | {capacity})

    def _step(self, key, make_fn):
        step = self.graphs.get(key)
        if step is None:
            # A capture's warm-up calls execute the step: keep the state they advance or overwrite
            # (the K/V they write are the values the real step writes), so a capture mid-generation
            # is safe too.
            state = [self.ar_token, self.ar_pos, *self.ctx_feats.values()]
            saved = [t.clone() for t in state]
            step = self.runner.step_factory(make_fn(), (), self.runner.pool)
            for t, s in zip(state, saved):
                t.copy_(s)
            self.graphs[key] = step
        return step

    def capture_all(self, block_size: int | None) -> int:
        """Captures the AR step (and the spec step for `block_size` > 1) for every kv span, with
        scratch control values (writes land in slots 0..B-1, rewritten by the next prefill).
        Must run outside a generation: a capture's warm-up calls execute the step."""
        if not self.runner.use_graphs:
            return 0
        spec = block_size is not None and block_size > 1 and self.drafter is not None
        wanted = [("ar", s) for s in self.spans()] + ([("spec", block_size, s) for s in self.spans()] if spec else [])
        if all(k in self.graphs for k in wanted):
            return len(self.graphs)                             # the per-generation call: nothing to do
        for span in self.spans():
            self.ar_pos.fill_(0)
            self._step(("ar", span), lambda: self._ar_fn(span))
            if block_size is not None and block_size > 1 and self.drafter is not None:
                self._spec_buffers(block_size)
                self._send(block_size, [0, 0, 0, block_size, 0, 0] + [0] * (block_size - 1))
                self._step(("spec", block_size, span), lambda: self._spec_fn(block_size, span))
        return len(self.graphs)

    # -- per-step calls (host side) --------------------------------------------------------------
    def ar_begin(self, token: int, position: int) -> None:
        """The next AR step feeds `token` at `position`."""
        self.ar_token.fill_(int(token))
        self.ar_pos.fill_(int(position))

    def ar_step(self, position: int) -> int:
        """One greedy AR step at `position` (must be the position ar_begin / the last step left)."""
        if not self.runner.use_graphs:
            return int(self._ar_fn(position + 1)().item())
        step = self._step(("ar", kv_bucket(position + 1, self.runner.capacity)),
                          lambda: self._ar_fn(kv_bucket(position + 1, self.runner.capacity)))
        return int(step().item())                              # the one host sync per token

    def write_prompt_context(self, features) -> None:
        """Draft context for the whole prompt (features [1, n, F] at positions 0..n-1), eagerly."""
        positions = torch.arange(features.shape[1], device=features.device)
        with self.runner.kernel_ctx(features.shape[1]):
            self.drafter.write_context(features, positions, self.runner.draft_cache)

    def spec_step(self, b: int, start: int, ctx_start: int, ctx_count: int, vs: int, anchor: int,
                  forced=None) -> list:
        """One greedy DFlash step; returns [matched, block x B, posterior x B] as ints."""
        if not 2 <= vs <= b:
            raise ValueError(f"spec_step: verify size {vs} must be in [2, block {b}]")
        self._spec_buffers(b)
        extra = [0] * (b - 1) if forced is None else list(forced) + [0] * (b - 1 - len(forced))
        self._send(b, [start, ctx_start, ctx_count, vs, anchor, int(forced is not None)] + extra)
        if not self.runner.use_graphs:
            return self._spec_fn(b, start + vs)().tolist()
        span = kv_bucket(start + vs, self.runner.capacity)
        step = self._step(("spec", b, span), lambda: self._spec_fn(b, span))
        return step().tolist()                                 # the one host sync per step
