"""EngineConfig: every kernel and mechanism choice of the engine, in one frozen dataclass.

The defaults are the measured winners (docs/design.md). A choice that cannot apply falls back
on its own: on the CPU, or in fp32, or in a build without the CUDA op, the CUDA-only fields are
ignored and the torch references run. Environment variables hold paths and credentials only
(settings.py), never speed switches.

The Engine hands its config down to the models through `use(config)` around every forward it runs
(StepRunner.kernel_ctx), and the op dispatch reads `current()`: a forward run outside an engine
sees the defaults. A CUDA graph keeps the choices it was captured with.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, fields

ATTENTION_CHOICES = ("auto", "specpilot", "sdpa")
TWO_LEVEL_CHOICES = ("off", "certified-head", "prefix-first")


@dataclass(frozen=True)
class EngineConfig:
    cuda_graphs: bool = True
    """Run the fixed-shape steps (AR, verify, draft, the fused steps) as CUDA graphs (CUDA only;
    eager elsewhere)."""
    compile_layers: bool = False
    """torch.compile each decoder layer for the graphed steps (opt-in, CUDA); fuses the elementwise
    ops between the GEMMs, with eager-equal bf16 rounding (emulate_precision_casts)."""
    fused_steps: bool = True
    """Greedy decoding runs each AR token / speculative block as one whole-step call (fused_steps.py)
    instead of separate draft and verify calls with host glue between them."""
    early_launch: bool = True
    """Launch each fused greedy step as soon as the host has read the previous one: the spec step
    writes the next step's control on the device, the AR loop keeps one token in flight."""
    step_kernels: bool = True
    """The fused spec step's argmax / accept bookkeeping as two CUDA kernels (csrc/cuda/spec_step.cu)
    instead of ~25 small torch kernels (bf16 CUDA logits)."""
    fused_kernels: bool = True
    """add_rms_norm, qk_norm_rope_cache and silu_mul as fused CUDA kernels (bf16 CUDA). Off also
    turns off fused_gemv and skinny_gemm, whose prologues are these kernels' arithmetic."""
    fused_gemv: bool = True
    """One-token steps run their bf16 linears as our GEMV with the norm / SwiGLU gate fused in
    (ops/linear.py): AR step 4.49 vs 5.25 ms with cuBLAS (Qwen3-8B shape, H200)."""
    gemv_pdl: bool = True
    """Launch the fused GEMVs with programmatic dependent launch (overlaps the previous kernel's tail)."""
    skinny_gemm: bool = True
    """Steps of 2..16 token rows (verify, draft) run their linears through our TMA + wgmma skinny GEMM
    (ops/linear.py): verify 4.74 vs 5.10 ms with cuBLAS (Qwen3-8B shape, H200)."""
    split12_decode_grid: bool = True
    """The split12 skinny GEMM pair cuts row blocks into K pieces to give every SM a CTA where the
    planner's grid covers fewer than half of them (split12 verify 5.27 -> 5.16 ms, H100)."""
    attention: str = "auto"
    """Which attention `ops.attention.attend` runs: "auto" (our split-KV decode kernel where it takes the
    call, SDPA elsewhere and inside torch.compile), "specpilot" (the kernel; an error on CUDA
    without it built) or "sdpa" (torch's scaled_dot_product_attention everywhere)."""
    attention_fused_rope: bool = True
    """A one-token target step's q/k norm, rope and cache write run inside the attention kernel."""
    attention_pdl: bool = True
    """Launch the attention kernels (rope prologue, split, combine) with programmatic dependent launch."""
    variants_manifest: str | None = None
    """A JSON manifest of agent-integrated kernel variants ("gpu|op|NxK" -> record, written by the
    agent loop) to dispatch the split12 M = 1 GEMV to; None: the shipped kernels only."""
    draft_vocab: int = 0
    """The drafter's LM head over the N most frequent tokens only (models/draft_vocab.py, FR-Spec);
    0: the full head. Drafts only: outputs cannot change, tau may drop (docs/two_level.md)."""
    draft_vocab_ranking: str | None = None
    """The token ranking JSON for draft_vocab (`specpilot draft-vocab` writes it); None: the
    drafter folder's token_ranking.json."""
    two_level: str = "off"
    """Two-level verification (docs/two_level.md): "off"; "certified-head" (greedy: the verify
    argmax certified from a shortlist and row bounds, exact LM head only where not certified;
    engine/certified_head.py, a torch reference on the stepwise loop); "prefix-first" is the batched
    engine's (BatchConfig.verify_prefix): refused here."""
    tree_budget: int = 0
    """Tree verification (docs/trees.md): each step verifies a tree of this many nodes (the anchor
    included) built from the drafter's block distributions, in one target pass: greedy on a dense target
    with fused_steps, one fused step a block (engine/tree/fused.py); otherwise the stepwise tree loop
    (greedy, or recursive rejection sampling at temperature > 0). 0: chain verification."""
    graph_kv_step: int = 0
    """The key span of a CUDA-graphed step (one graph per span; engine/graphs.py kv_bucket): 0, the next
    power of two >= the context (from 256); N, a multiple of 64: the next multiple of N. A graphed
    attention reads its whole span: finer spans read less at long contexts, for more graphs to capture."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"EngineConfig.{f.name} must be True or False, got {value!r}")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"EngineConfig.attention must be one of {ATTENTION_CHOICES}, got {self.attention!r}")
        if self.two_level not in TWO_LEVEL_CHOICES:
            raise ValueError(f"EngineConfig.two_level must be one of {TWO_LEVEL_CHOICES}, got {self.two_level!r}")
        if self.two_level == "prefix-first":
            raise ValueError("two_level='prefix-first' runs on the batched engine only: BatchConfig.verify_prefix "
                             "(CLI: --two-level prefix-first with --concurrency N > 1; docs/two_level.md)")
        if not isinstance(self.draft_vocab, int) or isinstance(self.draft_vocab, bool) or self.draft_vocab < 0:
            raise ValueError(f"EngineConfig.draft_vocab must be an int >= 0 (0: the full head), got {self.draft_vocab!r}")
        if not isinstance(self.tree_budget, int) or isinstance(self.tree_budget, bool) or self.tree_budget < 0:
            raise ValueError(f"EngineConfig.tree_budget must be an int >= 0 (0: chain verification), "
                             f"got {self.tree_budget!r}")
        if not isinstance(self.graph_kv_step, int) or isinstance(self.graph_kv_step, bool) or \
                self.graph_kv_step < 0 or self.graph_kv_step % 64:
            raise ValueError(f"EngineConfig.graph_kv_step must be 0 (powers of two) or a positive multiple of 64 "
                             f"(the cache's slot alignment), got {self.graph_kv_step!r}")
        if self.draft_vocab_ranking is not None and not isinstance(self.draft_vocab_ranking, str):
            raise ValueError(f"EngineConfig.draft_vocab_ranking must be a path string or None, "
                             f"got {self.draft_vocab_ranking!r}")
        if self.variants_manifest is not None and not isinstance(self.variants_manifest, str):
            raise ValueError(f"EngineConfig.variants_manifest must be a path string or None, "
                             f"got {self.variants_manifest!r}")


DEFAULT = EngineConfig()
_current: contextvars.ContextVar[EngineConfig] = contextvars.ContextVar("specpilot_engine_config", default=DEFAULT)


def current() -> EngineConfig:
    """The config of the forward being run (the defaults outside an engine)."""
    return _current.get()


@contextlib.contextmanager
def use(config: EngineConfig):
    """Within the block, op dispatch reads `config`."""
    if not isinstance(config, EngineConfig):
        raise TypeError(f"use() needs an EngineConfig, got {type(config).__name__}")
    token = _current.set(config)
    try:
        yield config
    finally:
        _current.reset(token)
