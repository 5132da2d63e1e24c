"""Engine: static caches + step runner + the AR and speculative loops (the engine API)."""
from __future__ import annotations

import dataclasses
import time

import torch

from specpilot.config import EngineConfig
from specpilot.models.draft_vocab import prepare_draft_vocab
from specpilot.verify.sampling import validate_sampling

from .ar_loop import run_ar
from .block_draft import warm_block_drafts
from .cache import drafter_cache, target_cache
from .certified_head import CertifiedHead
from .replay import GREEDY
from .result import GenerationResult
from .spec import run_spec
from .spec_session import new_session, run_spec_session
from .steps import StepRunner
from .tree.graphs import warm_tree_graphs
from .tree.loop import TREE_EAGER, check_tree_request, run_tree_spec


HYBRID_STEPWISE = ("hybrid recurrent target: a CUDA graph per AR / verify step, but no fused greedy steps or "
                   "compiled layers, since each step first commits the recurrent state of the accepted prefix on "
                   "the host (engine/hybrid_graphs.py)")
HYBRID_EAGER = "hybrid recurrent target: eager step loop (no CUDA graphs), since "


class Engine:
    def __init__(self, target, drafter=None, max_seq_len: int = 4096, config: EngineConfig = EngineConfig()):
        """max_seq_len bounds prompt + new tokens; config: every kernel and mechanism choice
        (specpilot.config.EngineConfig; CUDA-only choices fall back by themselves elsewhere)."""
        if not isinstance(config, EngineConfig):
            raise TypeError(f"Engine config must be an EngineConfig, got {type(config).__name__}")
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len={max_seq_len} must be >= 2")
        if drafter is not None and drafter.target is not target:
            raise ValueError("the drafter was loaded against a different target (load_drafter(dir, target))")
        reasons = []
        if getattr(target, "is_hybrid", False):         # see HYBRID_STEPWISE, HYBRID_EAGER
            blocker = target.graph_blocker()
            reasons.append(HYBRID_STEPWISE if blocker is None else HYBRID_EAGER + blocker)
            config = dataclasses.replace(config, cuda_graphs=config.cuda_graphs and blocker is None,
                                         fused_steps=False, compile_layers=False)
        if config.tree_budget:                          # see TREE_EAGER
            reasons.append(TREE_EAGER)
        self.eager_reason = "; ".join(reasons) or None
        self.target, self.drafter = target, drafter
        self.max_seq_len = max_seq_len
        self.device = target.device
        self.config = config
        self.use_graphs = config.cuda_graphs and self.device.type == "cuda"
        self.cache = target_cache(target, 1, max_seq_len)
        self.draft_cache = drafter_cache(drafter, 1, max_seq_len) if drafter is not None else None
        target.ensure_rope(self.cache.slots)                   # every slot, the trash slot included
        target.prepare()
        if drafter is not None:
            drafter.ensure_rope(self.cache.slots)
            prepare_draft_vocab(drafter, config)               # the reduced draft head, before any capture
        self.certified_head = CertifiedHead(target) if config.two_level == "certified-head" else None
        self.runner = StepRunner(target, drafter, self.cache, self.draft_cache, self.use_graphs, config=config)
        if config.compile_layers:   # the other kinds' draft steps do not run through compiled layers
            compile_decoder_layers(target, drafter if drafter_kind(drafter) == "dflash" else None)

    # -- helpers shared by the loops -------------------------------------------------------------
    def check_request(self, prompt_ids, max_new_tokens: int, temperature: float, room: int = 0):
        if len(prompt_ids) == 0:
            raise ValueError("empty prompt: at least one prompt token is needed")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        validate_sampling(temperature)
        total = len(prompt_ids) + max_new_tokens + room
        if total > self.max_seq_len:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + max_new_tokens={max_new_tokens}"
                             f"{f' + block {room}' if room else ''} = {total} exceeds the engine's "
                             f"max_seq_len={self.max_seq_len}")
        vocab = self.target.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocab (size {vocab})")
        return torch.tensor([list(map(int, prompt_ids))], dtype=torch.long, device=self.device)

    def generator(self, seed):
        """A generator on the model's device seeded `seed` (same draws as torch.manual_seed(seed)),
        or the device's default generator when seed is None."""
        if seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(int(seed))

    def clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    @torch.inference_mode()
    def warmup(self, block_size=None) -> int:
        """Captures every CUDA graph a generation can need (AR, verify and draft steps for each kv span
        bucket), so no capture lands inside a timed decode. Writes scratch K/V that later writes
        overwrite before they are visible. Returns the number of graphs; no-op (0) without graphs."""
        if not self.runner.use_graphs:          # the runner's: CPU tests run the path with StaticShapeStep
            return 0
        b = block_size or (self.drafter.block_size if self.drafter is not None else 1)
        capacity = self.runner.capacity
        spans = self.runner.kv_spans()                # the config's buckets: exactly those the steps ask for
        ids = torch.zeros(1, b, dtype=torch.long, device=self.device)
        # the verify reads target features only for a drafter that uses them (not plain PARD)
        verify_features = self.drafter is not None and new_session(self, b).uses_features
        for span in spans:
            for t in sorted({1, b}):
                start = max(0, span - t)
                if start + t <= capacity:
                    self.runner.warm_target_step(ids[:, :t], start, t > 1 and verify_features)
            if drafter_kind(self.drafter) == "dflash" and b > 1 and span - b >= 1:
                ctx = torch.zeros(1, 1, len(self.runner.feature_layers) * self.target.config.hidden_size,
                                  device=self.device, dtype=self.target.dtype)
                self.runner.draft_step(ctx, span - b - 1, ids, span - b, b)
        if self.config.tree_budget:                    # the tree verify forward (engine/tree/graphs.py)
            warm_tree_graphs(self.runner, self.config.tree_budget, b, self.target.dtype)
        if drafter_kind(self.drafter) in ("dflash2", "dspark", "pard"):
            warm_block_drafts(self, b)                 # their greedy draft graphs (engine/block_draft.py)
        if self.config.fused_steps:
            dflash = drafter_kind(self.drafter) == "dflash"
            self.runner.fused.capture_all(b if dflash else None, self.config.tree_budget if dflash else 0)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return len(self.runner.graphs) + len(self.runner.fused.graphs)

    # -- the API -------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate_ar(self, prompt_ids, max_new_tokens: int, stop_ids=(), temperature: float = 0.0,
                    seed=None, on_tokens=None) -> GenerationResult:
        """Target-only decoding: greedy at temperature 0 (equals HF greedy generate), else sampled.
        on_tokens(list of token ids): called with each new token as it is produced (streaming)."""
        ids = self.check_request(prompt_ids, max_new_tokens, temperature)
        return run_ar(self, ids, max_new_tokens, tuple(stop_ids), temperature, self.generator(seed), on_tokens)

    @torch.inference_mode()
    def generate_spec(self, prompt_ids, max_new_tokens: int, stop_ids=(), temperature: float = 0.0,
                      block_size=None, replay=None, seed=None, on_tokens=None) -> GenerationResult:
        """The stock DFlash loop (dflash 0.1.0 `dflash_generate`), token for token (engine/spec.py); a
        DFlash2 / DSpark / PARD drafter drafts through its session (engine/spec_session.py).
        replay: an AcceptanceReplay forcing each step's accepted count (a benchmark device; greedy only).
        on_tokens(list of token ids): called with each step's committed tokens (streaming; the session
        loop of the other drafter kinds calls it once, with the whole output)."""
        if self.drafter is None:
            raise ValueError("generate_spec needs a drafter: Engine(target, drafter)")
        block_size = self.drafter.block_size if block_size is None else int(block_size)
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be >= 1")
        if self.certified_head is not None and temperature > 0:
            raise ValueError("two_level='certified-head' certifies the greedy argmax only: use temperature=0")
        if replay is not None and temperature > 0:
            raise ValueError("replay works with greedy decoding only (temperature=0)")
        if self.config.tree_budget:
            check_tree_request(self, temperature, replay)
            ids = self.check_request(prompt_ids, max_new_tokens, temperature, room=self.config.tree_budget)
            return run_tree_spec(self, ids, max_new_tokens, tuple(stop_ids), block_size, self.config.tree_budget,
                                 temperature, self.generator(seed))
        ids = self.check_request(prompt_ids, max_new_tokens, temperature)
        policy = GREEDY if replay is None else replay
        if drafter_kind(self.drafter) == "dflash":
            return run_spec(self, ids, max_new_tokens, tuple(stop_ids), temperature, block_size, policy,
                            self.generator(seed), on_tokens)
        result = run_spec_session(self, ids, max_new_tokens, tuple(stop_ids), temperature, block_size, policy,
                                  self.generator(seed))
        if on_tokens is not None:
            on_tokens(list(result.tokens))
        return result


def compile_decoder_layers(target, drafter=None) -> None:
    """Compiled copies of every decoder layer's forward, used only inside the fixed-shape (graphed)
    steps; odd-shaped eager calls (prefill, tail blocks) keep the plain modules. Layers of one model
    share a compiled graph per shape (parameters are graph inputs)."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    inductor_config.emulate_precision_casts = True      # round intermediates to bf16 where eager does
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, 64)            # one graph per (T, kv span): a dozen at most
    for model in (target, drafter):
        if model is not None:
            model.compiled_layers = [torch.compile(layer.forward, dynamic=False, fullgraph=True)
                                     for layer in model.layers]


def drafter_kind(drafter):
    """'dflash' (run_spec and its fused step), another kind (run_spec_session), or None."""
    return None if drafter is None else getattr(drafter, "kind", "dflash")
