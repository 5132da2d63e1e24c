"""BatchConfig: the batched engine's scheduler, cache and mechanism choices, in one frozen dataclass
beside EngineConfig (which still chooses every kernel: the batched engine hands it to the models).

The three batching mechanisms are switches here, so that each one's gain is measured by turning it
off alone (docs/design.md, "Batched engine"). Every setting is lossless: a switch changes how much
work a step does and how it is laid out, never which token the target commits.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class BatchConfig:
    ragged_verify: bool = True
    """One target forward per step over every running request's verify rows and every newcomer's
    prefill chunk, laid out varlen (rows concatenated, per-request attention); off: one target
    forward per request."""
    batched_draft: bool = True
    """One draft context-append pass and one block forward per step over every running request's
    rows; off: one context-append and one block forward per request."""
    adaptive_verify: bool = True
    """Each step verifies only a prefix of every drafted block, one length T for the step among the
    block's quarters, chosen before the verify forward (no read-back of the step's draft) from pooled
    per-position acceptance rates of earlier steps (Beta-Bernoulli counts) and a step-cost table that
    BatchEngine.warmup measures on the card (adaptive.py, profile.py); off: every request verifies its
    full block. The drafter always drafts its block. On by default: it won at C = 8 / 16 / 32 on an
    H100 (docs/design.md, "Batched engine"); bench --concurrency's no_adaptive_verify row measures it.
    Prefix-first (verify_prefix > 0) replaces it: both trim the verify rows (see `adaptive`)."""
    verify_prefix: int = 0
    """Prefix-first verification (docs/two_level.md): a first target forward over the first P rows of
    every decoding request's block (anchor + P-1 drafts, which judge drafts 1..P), and a second one
    over the rest of the block only for the requests that accepted all P (engine/batch/prefix_first.py).
    0: off, one forward over whole blocks. Must be below the block size; in place of adaptive verify."""
    page_size: int = 16
    """KV cache slots per page (block table entry), for the target and the drafter caches alike."""
    prefill_chunk: int = 256
    """Prompt tokens prefilled per step over all newcomers together, so that a long prompt delays the
    running requests' next step by at most one chunk's forward."""
    adaptive_probe_every: int = 16
    """With adaptive verify, every this-many-th step chooses its verify length as if every draft past
    the length first chosen were surely accepted (an upper bound on what they could add), so that those
    draft positions get acceptance labels whenever they could pay; 0: never (they then borrow their
    predecessor's rate)."""
    cost_ridge_tokens: int = 256
    """Where no step-cost table is measured (a CPU run; BatchEngine(step_costs=...) gives one, warmup
    measures one on a GPU), the adaptive budget assumes a verify forward costs the same up to this many
    rows and grows linearly past it (a GPU's ridge)."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"BatchConfig.{f.name} must be True or False, got {value!r}")
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"BatchConfig.{f.name} must be an int, got {value!r}")
        if min(self.page_size, self.prefill_chunk, self.cost_ridge_tokens) < 1:
            raise ValueError(f"BatchConfig page_size={self.page_size}, prefill_chunk={self.prefill_chunk} and "
                             f"cost_ridge_tokens={self.cost_ridge_tokens} must be >= 1")
        if self.verify_prefix < 0:
            raise ValueError(f"BatchConfig.verify_prefix={self.verify_prefix} must be >= 0 (0: off)")
        if self.adaptive_probe_every < 0:
            raise ValueError(f"BatchConfig.adaptive_probe_every={self.adaptive_probe_every} must be >= 0 (0: never)")

    @property
    def adaptive(self) -> bool:
        """Whether steps choose their verify length adaptively: adaptive_verify, unless prefix-first
        (verify_prefix) replaces it."""
        return self.adaptive_verify and not self.verify_prefix
