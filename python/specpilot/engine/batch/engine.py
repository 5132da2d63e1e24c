"""BatchEngine: continuous batching of speculative (or, without a drafter, AR) requests over paged
KV caches, one scheduler iteration per `step()`.

A step:
  admit     queued requests while the running count < max_batch and their pages are free (a request
            reserves every page it can touch; one that could never fit is refused with its own error)
  draft     every decoding request drafts its block [anchor, mask ...] (the drafter's block, or the
            tail left before max_length): context append of its rows committed since, then the block
            forward (one pass over all requests, or one per request: BatchConfig.batched_draft)
  lengths   the verify length per request: the whole block, or the adaptive prefix (adaptive.py),
            chosen from the host's estimate of earlier steps (nothing of this step is read back first)
  verify    one target forward over every decoding request's verify rows and the newcomers' prefill
            chunks (at most BatchConfig.prefill_chunk prompt rows a step), or one per request; with
            BatchConfig.verify_prefix, two passes: the blocks' prefixes, then the rest of the blocks
            whose prefix was accepted whole (prefix_first.py)
  accept    per request, the single-request engine's rule (engine/accept.py; rejection sampling with
            the request's own generator at temperature > 0), commit, stop / finish
Every request's tokens equal what Engine.generate_spec (generate_ar without a drafter) makes for it
alone: the same forwards row for row, the same accept rule, the same draws from its own generator.
Hybrid recurrent targets (HybridLM): the attention layers' K/V in the paged cache, each request's GDN
conv and recurrent state in a slot of its own (hybrid_state.py), the target forward forward_hybrid.py's;
eager only (no CUDA graphs), with a drafter of any kind or none.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from specpilot import config as config_module
from specpilot.config import EngineConfig
from specpilot.engine.engine import drafter_kind
from specpilot.engine.linear_kernels import cuda_switchable, linear_kernel_for_rows
from specpilot.models.target import Attention
from specpilot.verify.sampling import sample

from .adaptive import AcceptanceEstimator, StepCostTable, choose_step_rows, verify_row_choices
from .config import BatchConfig
from .forward import Staging
from .graphed import DecodeGraphs, request_bucket
from . import hybrid_state, kind_drafting
from .paged import PagedKV, PagePool, kv_layers, pages_for
from .profile import measure_step_costs
from .request import BatchResult, Request, RequestState, request_problem


class BatchEngine:
    def __init__(self, target, drafter=None, config: BatchConfig = BatchConfig(), max_batch: int = 8,
                 kv_pages: int | None = None, memory_fraction: float | None = None,
                 engine_config: EngineConfig = EngineConfig(), step_costs: StepCostTable | None = None,
                 block_size: int | None = None, graph_step_factory=None):
        """block_size: the speculative block (default and at most the drafter's trained block); kv_pages: the page pool (config.page_size slots a page) for the target and drafter caches, or
        memory_fraction of the free GPU memory (CUDA); engine_config: the kernel choices the models'
        ops read; step_costs: the adaptive budget's cost table (None: config.cost_ridge_tokens roofline);
        graph_step_factory: what captures the decode forwards (graphed.py): None = CUDA graphs on a GPU
        when engine_config.cuda_graphs, else eager; graphs.StaticShapeStep runs that path on the CPU (tests)."""
        if not isinstance(config, BatchConfig):
            raise TypeError(f"BatchEngine config must be a BatchConfig, got {type(config).__name__}")
        if not isinstance(engine_config, EngineConfig):
            raise TypeError(f"engine_config must be an EngineConfig, got {type(engine_config).__name__}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch={max_batch!r} must be an int >= 1")
        if drafter is not None and drafter.target is not target:
            raise ValueError("the drafter was loaded against a different target (load_drafter(dir, target))")
        kind = drafter_kind(drafter)
        if kind is not None and kind not in kind_drafting.supported():
            raise ValueError(f"the batched engine drafts with {', '.join(kind_drafting.supported())} drafters only "
                             f"(engine/batch/kind_drafting.py); a {kind} drafter runs single-request (Engine.generate_spec)")
        hybrid = getattr(target, "is_hybrid", False)
        if not hybrid and not all(isinstance(layer.attn, Attention) for layer in target.layers):
            raise ValueError("the batched engine runs dense attention targets or hybrid recurrent targets "
                             "(HybridLM) only")
        if drafter is not None:
            block_size = drafter.block_size if block_size is None else block_size
            if isinstance(block_size, bool) or not isinstance(block_size, int) or not 2 <= block_size <= drafter.block_size:
                raise ValueError(f"block_size={block_size!r} must be an int in 2..{drafter.block_size} (the drafter's block)")
        if config.verify_prefix and drafter is not None and config.verify_prefix >= block_size:
            raise ValueError(f"BatchConfig.verify_prefix={config.verify_prefix} must be below the block size "
                             f"{block_size} (at the block size the first pass is the whole block)")
        self.eager_reason = None
        if hybrid:
            problem = hybrid_state.unsupported(block_size if drafter is not None else 1, graph_step_factory is not None)
            if problem is not None:
                raise ValueError(problem)
            if target.device.type == "cuda" and engine_config.cuda_graphs:
                self.eager_reason = hybrid_state.EAGER
                engine_config = dataclasses.replace(engine_config, cuda_graphs=False)
        self.target, self.drafter = target, drafter
        self.config, self.engine_config = config, engine_config
        self.max_batch = max_batch
        self.device = target.device
        self.page_size = config.page_size
        # a hybrid target's per-request recurrent state (hybrid_state.py), before the pages take the memory
        self.recurrent = hybrid_state.RecurrentSlots(target.config, max_batch, self.device, target.dtype) if hybrid else None
        step_states = self.recurrent.step_bytes(max_batch * (block_size if drafter is not None else 1)
                                                + config.prefill_chunk, max_batch) if hybrid else 0
        self.pool = PagePool(pages_for(target, drafter, config.page_size, kv_pages, memory_fraction, step_states))
        pages = self.pool.num_pages
        c = target.config
        # One page past the pool: the trash page that padded rows of a graphed forward write to.
        self.trash_slot = pages * self.page_size
        self.cache = PagedKV(kv_layers(target), c.num_kv_heads, c.head_dim, pages + 1, self.page_size, self.device, target.dtype)
        self.draft_cache = None
        if drafter is not None:
            d = drafter.config
            self.draft_cache = PagedKV(d.num_layers, d.num_kv_heads, d.head_dim, pages + 1, self.page_size,
                                       self.device, target.dtype)
        self.staging = Staging(self.device)           # the per-step index uploads
        self.kind_drafting = kind_drafting.for_engine(self, kind)   # None: DFlash's own path (step.py)
        self.feature_layers = tuple(drafter.target_layer_ids) if drafter is not None else ()
        self.block_size = block_size if drafter is not None else 1
        self.graphs = None
        self.graph_features = None                  # the last graphed verify's features output, each request's first row
        self.ar_in_flight = None                    # AR: the step launched ahead of the host (ar_lookahead.py)
        if graph_step_factory is not None or (self.device.type == "cuda" and engine_config.cuda_graphs):
            self.graphs = DecodeGraphs(self, graph_step_factory)
        # The adaptive budget's prices: given, else measured on this card by warmup (profile.py); a
        # CPU run has no card to price, so it keeps the roofline.
        self.costs = step_costs or StepCostTable.roofline(config.cost_ridge_tokens)
        self.costs_measured = step_costs is not None
        self.estimator = AcceptanceEstimator(max(self.block_size - 1, 1))
        # The verify rows per request a step can run (each a captured graph): the block, or with
        # adaptive verify its quarters.
        self.verify_row_choices = (verify_row_choices(self.block_size) if config.adaptive and drafter is not None
                                   else (self.block_size,))
        self.steps = 0
        # host seconds of the steps that carried prompt rows (prefill chunks) and of the decode-only
        # ones: how much of a closed-loop run prefill takes, which batched AR and spec pay alike
        self.prefill_steps, self.prefill_step_s, self.decode_step_s = 0, 0.0, 0.0
        self.block_rows = self.verify_rows = 0      # decode rows drafted (anchors included) / verified
        self.priced_rows = 0                        # the verify rows the step-cost table priced this step
        self.second_passes = self.second_pass_requests = 0   # prefix-first: steps / request steps with a pass 2
        self.queue, self.running = [], []
        self._finished = []                         # results not yet handed out by step()
        self._next_id = 0
        self._switchable = cuda_switchable((target, drafter))

    # -- the API -------------------------------------------------------------------------------
    def submit(self, request: Request) -> int:
        """Queues `request`; returns its id. A bad request (empty or out-of-vocab prompt, bad
        max_new_tokens / temperature / top_p, too long for the whole cache) gets an id too, and its
        result, with the error, comes out of the next step()."""
        rid, self._next_id = self._next_id, self._next_id + 1
        problem = request_problem(request, self.target.config.vocab_size)
        if problem is None:
            need = self.pages_needed(request)
            if need > self.pool.num_pages:
                problem = (f"prompt of {len(request.prompt_ids)} tokens + max_new_tokens={request.max_new_tokens} "
                           f"needs {need} KV pages of {self.page_size} slots, but the whole cache holds "
                           f"{self.pool.num_pages}")
        state = RequestState(id=rid, req=request, submitted_s=time.perf_counter(), generator=None)
        if problem is not None:
            self._finished.append(BatchResult(prompt_len=len(getattr(request, "prompt_ids", ()) or ()), tokens=[],
                                              request_id=rid, error=problem))
            return rid
        if request.seed is not None:
            state.generator = torch.Generator(device=self.device).manual_seed(int(request.seed))
        self.queue.append(state)
        return rid

    def cancel(self, request_id: int) -> bool:
        """Stops a queued or running request: its pages go back to the pool and its result (the tokens
        made so far, error "cancelled") comes out of the next step(). False if it is not in flight."""
        for group in (self.queue, self.running):
            for state in group:
                if state.id == request_id:
                    group.remove(state)
                    self._finish(state, "cancelled")
                    return True
        return False

    def warmup(self, max_context: int) -> int:
        """Captures every CUDA graph of the decode steps that requests of at most `max_context` positions
        (prompt + max_new_tokens) can need, at every batch size up to max_batch (graphed.py), so that no
        capture lands inside a run; then, with adaptive verify on a GPU, times those forwards into the
        step-cost table the verify lengths are chosen by (profile.py), unless one was given. Returns
        the number of graphs (0 without graphs)."""
        captured = 0
        with torch.inference_mode(), config_module.use(self.engine_config):
            if self.graphs is not None:
                captured = self.graphs.warmup(max_context)
        if self.config.adaptive and self.drafter is not None and self.device.type == "cuda" \
                and not self.costs_measured:
            self.costs = measure_step_costs(self, context=max(1, min(512, max_context - self.block_size)))
            self.costs_measured = True
        return captured

    def close(self) -> None:
        """Gives back the engine's device memory now (its KV caches, recurrent slots and CUDA graphs)
        rather than when the garbage collector next breaks the engine <-> graphs reference cycles: a
        process that builds one engine after another (the bench's runs, the agents' evaluations) would
        otherwise hold several at once. The engine cannot step after it."""
        if self.graphs is not None:
            self.graphs.steps.clear()
        self.graphs = self.graph_features = self.ar_in_flight = self.kind_drafting = None
        self.cache = self.draft_cache = self.recurrent = None
        self.queue, self.running = [], []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def progress(self) -> dict:
        """Request id -> its tokens committed so far, for every running request (streaming servers read
        it after each step; the lists are live: copy what you keep)."""
        return {state.id: state.tokens for state in self.running}

    @property
    def idle(self) -> bool:
        return not (self.queue or self.running or self._finished)

    def step(self) -> list:
        """One scheduler iteration; returns the results finished since the last step (BatchResult)."""
        t0 = time.perf_counter()                        # no sync: AR's lookahead keeps the GPU ahead
        with torch.inference_mode(), config_module.use(self.engine_config):
            self._admit()
            if self.running:
                prefilling = any(not s.decoding for s in self.running)
                self._iterate()
                self.steps += 1
                seconds = time.perf_counter() - t0
                if prefilling:
                    self.prefill_steps += 1
                    self.prefill_step_s += seconds
                else:
                    self.decode_step_s += seconds
                    if self.priced_rows:                  # a measured table learns the host's share
                        self.costs.observe_step(seconds, self.priced_rows)
        out, self._finished = self._finished, []
        return out

    def run_until_done(self) -> list:
        """Steps until nothing is queued or running; every result handed out meanwhile, by request id."""
        results = []
        while not self.idle:
            results.extend(self.step())
        return sorted(results, key=lambda r: r.request_id)

    def pages_needed(self, request: Request) -> int:
        """Pages a request reserves: every position up to prompt + max_new_tokens - 1."""
        return -(-(len(request.prompt_ids) + request.max_new_tokens) // self.page_size)

    def clock(self) -> float:
        """Wall time once the device's queued work is done: for timing forwards (profile.py). A request's
        own times (submit, first token, finish) are host events, stamped without it: the host holds
        the tokens by then, and a device sync would wait for the step AR's lookahead launched ahead."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    # -- scheduling ----------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.queue and len(self.running) < self.max_batch:
            state = self.queue[0]
            if self.recurrent is not None and not self.recurrent.free_slots:
                return                                  # it waits for a recurrent state slot
            pages = self.pool.alloc(self.pages_needed(state.req))
            if pages is None:
                return                                  # first come, first served: it waits for pages
            self.queue.pop(0)
            state.pages = pages
            if self.recurrent is not None:
                self.recurrent.take(state.id)
            for model in (self.target, self.drafter):
                if model is not None:
                    model.ensure_rope(state.max_length)
            self.running.append(state)

    def _finish(self, state: RequestState, error: str | None = None) -> None:
        if self.kind_drafting is not None:
            self.kind_drafting.release(state)
        if state.pages:
            self.pool.release(state.pages)
            state.pages = []
        if self.recurrent is not None:
            self.recurrent.release(state.id)
        result = state.result(time.perf_counter(), error)     # a host event (clock)
        if self.drafter is None:                        # AR: no verify steps, as Engine.generate_ar
            result.acceptance_lengths, result.steps = [], max(len(result.tokens) - 1, 0)
        if state.req.replay is not None:
            result.replay_shortfalls = state.req.replay.shortfalls
        self._finished.append(result)

    def kernels(self, rows: int):
        """The split12 / bf16-twin linears' kernel for a forward of `rows` token rows (CUDA)."""
        return linear_kernel_for_rows(self._switchable, rows)

    def _iterate(self) -> None:
        from . import ar_lookahead
        from .step import draft_all, verify_and_accept

        decoding = [s for s in self.running if s.decoding]
        self.priced_rows = 0
        if ar_lookahead.applies(self, decoding):
            ar_lookahead.step(self, decoding)
            self.block_rows += len(decoding)
            self.verify_rows += len(decoding)
        else:
            if self.ar_in_flight is not None:        # its tokens first, then the ordinary step
                ar_lookahead.drain(self)
                self._finish_done()
                decoding = [s for s in self.running if s.decoding]
            drafts = draft_all(self, decoding) if self.drafter is not None else {}
            chunks = self._chunks()
            lengths = self._verify_lengths(decoding, drafts, chunks)
            self.block_rows += sum(drafts[s.id].rows if s.id in drafts else 1 for s in decoding)
            self.verify_rows += sum(lengths.values())
            verify_and_accept(self, decoding, drafts, lengths, chunks)
        self._finish_done()
        if not self.running:
            self.ar_in_flight = None                 # nobody left to read it: its rows were all wasted
        if self.config.adaptive:
            self.estimator.end_step()               # this step's labels into the rates, O(block)

    def _chunks(self) -> list:
        """This step's prefill chunks, (state, rows) in arrival order: at most prefill_chunk rows, and on
        the graphed path at most one forward's tiles, so that they ride in one forward (a chunk whose
        last tile is partly padding takes a whole tile; past the tiles, a second forward would read
        every weight again)."""
        chunks, budget = [], self.config.prefill_chunk
        tile = self.graphs.prefill_tile if self.graphs is not None else 1
        tiles = self.graphs.prefill_requests if self.graphs is not None else budget
        for state in self.running:
            if state.decoding:
                continue
            rows = min(budget, state.prompt_len - state.prefilled, tiles * tile)
            if rows <= 0:
                break
            chunks.append((state, rows))
            budget, tiles = budget - rows, tiles - -(-rows // tile)
        return chunks

    def _finish_done(self) -> None:
        for state in [s for s in self.running if s.done]:
            self.running.remove(state)
            self._finish(state)

    def _verify_lengths(self, decoding: list, drafts: dict, chunks: list) -> dict:
        """Request id -> verify rows (anchor included): the whole block, or with adaptive verify at most
        the step's T* (adaptive.py), from host state only (no read-back between draft and verify), with
        the step's prefill chunks priced in the same forward (graphed: in whole tiles); every
        adaptive_probe_every-th step the T* of the optimistic bound past the first T* (exploration)."""
        full = {s.id: drafts[s.id].rows if s.id in drafts else 1 for s in decoding}
        if not self.config.adaptive or not drafts:
            return full
        padded = request_bucket(len(decoding)) if self.graphs is not None else len(decoding)
        tile = self.graphs.prefill_tile if self.graphs is not None else 1
        prefill_rows = sum(-(-rows // tile) * tile for _, rows in chunks)
        every = self.config.adaptive_probe_every
        rows = choose_step_rows(self.estimator, [full[s.id] - 1 for s in decoding], padded, self.verify_row_choices,
                                self.costs, probe=bool(every) and self.steps % every == 0, prefill_rows=prefill_rows)
        self.priced_rows = padded * rows
        return {rid: min(n, rows) for rid, n in full.items()}

    def graph_rows(self, lengths: dict) -> int:
        """The rows per request of the graphed verify forward that holds every request's verify rows:
        the smallest of verify_row_choices at or above the longest."""
        need = max(lengths.values())
        return min(t for t in self.verify_row_choices if t >= need)

    def sample_first(self, state: RequestState, logits: torch.Tensor) -> int:
        """The prefill's token: greedy or one draw from the request's generator (logits [1, 1, V])."""
        r = state.req
        return int(sample(logits, r.temperature, state.generator, top_p=r.top_p).item())
