"""A candidate: what a proposer suggests and the gate judges, and how to build it into a callable.

Kinds (all share one calling convention per op, so the gate's logic is the same code):
- "cuda":    CUDA source under the NVRTC launch contract + launch geometry; GPU only.
- "python":  Python source defining the op's entry point (split12_gemv / chain_accept) in torch,
             on either device: what the LLM proposer emits when asked for torch code.
- "cpu":     a factory "module:function" returning a torch callable under the same contract
             (the built-in templates' CPU twins).
- "knob":    engine settings (e.g. block_size), judged end to end by the engine.
The id is a hash of everything that defines the candidate, so records are idempotent.
"""
import hashlib
import importlib
import json
import types
from dataclasses import asdict, dataclass, field


@dataclass
class Candidate:
    op: str                    # "split12_gemv" | "chain_accept" | "engine.block_size"
    shape: tuple               # (N, K) for GEMV; () for knobs
    kind: str                  # cuda | python | cpu | knob
    proposer: str              # builtin | llm:<model> | transfer | incumbent | exploit:<name>
    params: dict = field(default_factory=dict)
    source: str | None = None  # CUDA source (kind "cuda") or Python source (kind "python")
    label: str = ""

    @property
    def cand_id(self) -> str:
        body = json.dumps([self.op, list(self.shape), self.kind, self.params, self.source or ""], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:20]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    @staticmethod
    def from_dict(d: dict) -> "Candidate":
        return Candidate(op=d["op"], shape=tuple(d["shape"]), kind=d["kind"], proposer=d["proposer"],
                         params=dict(d.get("params") or {}), source=d.get("source"), label=d.get("label", ""))


def gemv_geometry(params: dict):
    """GemvParams from a candidate's params (builtin template params, or an LLM's explicit geometry)."""
    from specpilot.kernels.variants.split12_gemv_cuda import GemvParams

    keys = ("threads_per_row", "rows_per_block", "vec_groups", "unroll")
    return GemvParams(**{k: int(params[k]) for k in keys if k in params})


def build_callable(c: Candidate):
    """The candidate as fn(*contract args) for its device. CUDA kinds compile through the JIT."""
    if c.kind == "cpu":
        module, _, name = c.params["factory"].partition(":")
        factory = getattr(importlib.import_module(module), name)
        return factory(c)
    if c.kind == "cuda":
        return _cuda_callable(c)
    if c.kind == "python":
        return python_callable(c)
    raise ValueError(f"candidate kind {c.kind!r} has no callable form (op {c.op})")


ENTRY_POINTS = {"split12_gemv": "split12_gemv", "chain_accept": "chain_accept"}


def python_callable(c: Candidate):
    """Python source run in a fresh module namespace (in the worker, never the controller)."""
    entry = ENTRY_POINTS.get(c.op)
    if entry is None:
        raise ValueError(f"no Python entry point for op {c.op!r}")
    module = types.ModuleType(f"specpilot_candidate_{c.cand_id}")
    exec(compile(c.source or "", f"<candidate {c.label or c.cand_id}>", "exec"), module.__dict__)
    fn = module.__dict__.get(entry)
    if not callable(fn):
        raise ValueError(f"the candidate's source defines no function {entry}(...)")
    return fn


def _cuda_callable(c: Candidate):
    from specpilot.kernels.jit import JitKernel

    geometry = gemv_geometry(c.params)
    kernel = JitKernel(c.source, "split12_gemv")

    def split12_gemv(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad):
        grid, block = geometry.launch(N)
        kernel(grid, block, (lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad))

    split12_gemv.compiled = kernel.compiled
    return split12_gemv


def cpu_template_factory(c: Candidate):
    """Factory for builtin CPU twins: params are the template's GemvParams."""
    from specpilot.kernels.variants.split12_gemv_cpu import make_cpu_gemv

    return make_cpu_gemv(gemv_geometry(c.params))


def gemv_candidate(shape, params: dict, proposer: str, device: str) -> Candidate:
    """A builtin template candidate for the device ("cuda": rendered source; "cpu": the CPU twin)."""
    from specpilot.kernels.variants.split12_gemv_cuda import render

    geometry = gemv_geometry(params)
    p = geometry.to_dict()
    if device == "cuda":
        return Candidate("split12_gemv", tuple(shape), "cuda", proposer, p, render(geometry), geometry.label())
    p["factory"] = "specpilot.agents.candidates:cpu_template_factory"
    return Candidate("split12_gemv", tuple(shape), "cpu", proposer, p, None, geometry.label())
