"""The gap table: each component's measured time against its ceiling, ranked by time lost per
generated token. `cost_report(...)` is the API the agents read; `specpilot cost` prints it.

measured: the live implementation timed on the device (on the GPU: our one-token GEMV (ops/linear.py)
at M = 1, our skinny GEMM (ops/linear.py) at 2..16 rows, bf16 matmul above, or, for split12 weights
where the op is built, split12_linear with the kernel the engine picks for the row count
(engine/linear_kernels.py); attention by our decode / verify kernel where it takes the call, SDPA
otherwise; fp32 matmul and SDPA on the CPU); a hybrid target's GDN layers by the delta rule keeping
every row's state (the chain kernel per request on the GPU, the torch reference on the CPU). On the GPU each is timed as graph replays (timer.py)
cycling through enough copies of its weights or KV cache to exceed twice the L2, so that they
stream from HBM as a step's once-read operands do.
ceiling: max(bytes / copy bandwidth, flops / matmul rate, one launch).
launches: the step's kernels that no component times (shapes.UNTIMED_KERNELS, counted on the engine),
at the launch floor each (a tiny op in a CUDA graph on the GPU), against one launch.
lost per token = (measured - ceiling) * count / tokens the step produces.
An AR decode step produces `batch` tokens; a draft + verify step `batch * tau` (tau is stated).

bounds: each step's components summed, timed alone and at their ceilings, and the ratios with
every component at its ceiling: draft / verify at least, spec / AR at most, for any kernels that
keep the model's bytes and flops. A target that asks for a smaller draft / verify or a larger
spec / AR cannot be met with this pair, format and tau on this device.
"""
import functools
import math
from dataclasses import astuple, dataclass, field

import torch
import torch.nn.functional as F

from specpilot.cost.ceilings import Ceilings, measure_ceilings
from specpilot.cost.shapes import ModelShape, drafter_target_layers, step_components
from specpilot.cost.timer import time_call
from specpilot.ops import linear as ops_linear

SPLIT12_BYTES_PER_WEIGHT = 1.5  # 8-bit low byte + 4-bit code (escapes are a fraction of a percent)
SPLIT12_OP_MAX_M = 32           # the CUDA split12_linear takes M <= 32 (kCudaMaxM); larger M: bf16 matmul
MAX_COPIES = 64                 # of one operand, for the L2 rotation


@dataclass
class CostReport:
    deployment: dict
    ceilings: Ceilings
    rows: list = field(default_factory=list)   # dicts, ranked by lost_per_token_s
    bounds: dict = field(default_factory=dict)  # step_bounds(rows, tau)

    def actionable(self, ops=None) -> list:
        return [r for r in self.rows if r["actionable"] and (not ops or r["op"] in ops)]

    def to_dict(self) -> dict:
        return {"deployment": self.deployment, "ceilings": self.ceilings.to_dict(), "rows": self.rows,
                "bounds": self.bounds}


def _elem(device: str) -> int:
    return 2 if device == "cuda" else 4


class _Measurer:
    """Times each distinct shape once (a report has many repeats)."""

    def __init__(self, device: str, weights: str, reps: int):
        self.device, self.weights, self.reps = device, weights, reps
        self.dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.split12 = weights == "split12" and self._split12_available()

    def _split12_available(self) -> bool:
        if self.device != "cuda":
            return False  # on the CPU every linear is timed as an fp32 matmul (labelled)
        try:
            from specpilot import _ext

            return _ext.has_cuda_kernels()
        except Exception:
            return False

    def copies(self, nbytes: float) -> int:
        """How many copies of an operand of nbytes a timing cycles through: on the GPU enough to exceed
        twice the L2 (each is then read from HBM, as a step reads each weight once); one on the CPU."""
        if self.device != "cuda":
            return 1
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        return max(1, min(MAX_COPIES, math.ceil(2 * l2 / max(1.0, nbytes))))

    def _time_each(self, call, operands) -> float:
        """Seconds of one call(operand), cycling through `operands` (one graph of them all on the GPU)."""
        return time_call(lambda: [call(o) for o in operands], self.device, self.reps) / len(operands)

    @functools.lru_cache(maxsize=None)
    def linear(self, m: int, n: int, k: int) -> float:
        x = torch.randn(m, k, device=self.device, dtype=self.dtype)
        if self.split12 and self.device == "cuda" and m <= SPLIT12_OP_MAX_M:
            from specpilot.engine.linear_kernels import kernel_for_shape
            from specpilot.formats.split12 import ops as split12_ops
            from specpilot.kernels.variants.split12_args import pack  # packs on the weight's device

            planes = [pack(torch.randn(n, k, device=self.device, dtype=torch.bfloat16))
                      for _ in range(self.copies(1.5 * n * k))]
            out = torch.empty(m, n, device=self.device, dtype=torch.bfloat16)
            kernel = kernel_for_shape(m, k)  # what the engine's Split12Linear runs for m rows
            return self._time_each(lambda p: split12_ops.split12_linear(x, p, out, kernel=kernel), planes)
        weights = [torch.randn(n, k, device=self.device, dtype=self.dtype)
                   for _ in range(self.copies(n * k * x.element_size()))]
        if m == 1 and self.one_token_gemv(weights[0]):      # what the engine's one-token steps run
            return self._time_each(lambda w: ops_linear.gemv(x, w), weights)
        if ops_linear.skinny_takes_weight(x, weights[0]):       # what the engine's verify / draft steps run
            return self._time_each(lambda w: ops_linear.matmul(x, w), weights)
        return self._time_each(lambda w: F.linear(x, w), weights)

    def linear_label(self, dtype: str) -> str:
        if self.split12:
            skinny = ops_linear.skinny_enabled() and ops_linear.skinny_available()
            return ("split12_linear op (CUDA-core GEMV at M = 1, "
                    + (f"split12 skinny GEMM at 2..{ops_linear.SKINNY_MAX_ROWS} rows, " if skinny else "")
                    + "decode + cuBLAS above)")
        label = f"torch {dtype} matmul"
        if self.device == "cuda" and ops_linear.skinny_enabled() and ops_linear.skinny_available():
            label = f"skinny_gemm at M = 2..{ops_linear.SKINNY_MAX_ROWS}, " + label + " otherwise"
        if self.device == "cuda" and ops_linear.gemv_enabled() and ops_linear.gemv_available():
            label = "gemv_m1 (ops/linear.py) at M = 1, " + label
        if self.weights == "split12" and self.device == "cuda":
            label += " (split12 op not built: stand-in)"
        return label

    @staticmethod
    def one_token_gemv(w) -> bool:
        return ops_linear.gemv_enabled() and ops_linear.gemv_available() and ops_linear.gemv_weight_ok(w)

    @functools.lru_cache(maxsize=None)
    def attention(self, batch: int, q_len: int, heads: int, kv_heads: int, context: int, head_dim: int) -> float:
        """q_len new rows attending over `context` cached keys (causal within the rows): our kernel where
        it takes the call (the engine's), else SDPA with the KV heads repeated (a stand-in)."""
        from specpilot.kernels import decode_attention as kernel

        q = torch.randn(batch, heads, q_len, head_dim, device=self.device, dtype=self.dtype)
        nbytes = 2 * batch * kv_heads * context * head_dim * q.element_size()
        caches = [(torch.randn(batch, kv_heads, context, head_dim, device=self.device, dtype=self.dtype),
                   torch.randn(batch, kv_heads, context, head_dim, device=self.device, dtype=self.dtype))
                  for _ in range(self.copies(nbytes))]
        if kernel.supports(q, caches[0][0]):
            last = torch.arange(context - q_len, context, device=self.device)
            return self._time_each(lambda kv: kernel.decode_attention(q, kv[0], kv[1], last, head_dim ** -0.5), caches)
        groups = heads // kv_heads
        caches = [(k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)) for k, v in caches]
        return self._time_each(lambda kv: F.scaled_dot_product_attention(q, kv[0], kv[1]), caches)

    @functools.lru_cache(maxsize=None)
    def recurrent(self, batch: int, rows: int, recurrent) -> float:
        """One GDN layer's delta rule over `rows` rows of each of `batch` requests, every row's state
        kept: the chain kernel once per request as the engine runs it (CUDA bf16 where built), else the
        torch reference over the batch. The conv and gates are not in it (elementwise, small)."""
        from specpilot.kernels import gdn_chain
        from specpilot.models import gdn

        r = recurrent
        mixed = torch.randn(rows, 2 * r.key_heads * r.key_dim + r.value_heads * r.value_dim, device=self.device,
                            dtype=self.dtype)
        g = -torch.rand(rows, r.value_heads, device=self.device)
        beta = torch.rand(rows, r.value_heads, device=self.device)
        states = [torch.zeros(r.value_heads, r.key_dim, r.value_dim, device=self.device)
                  for _ in range(self.copies(r.state_bytes * (1 + rows)))]
        if gdn_chain.takes(mixed[None], r.key_dim, r.value_dim):
            return batch * self._time_each(
                lambda st: gdn_chain.gdn_chain(mixed, r.key_heads, r.key_dim, g, beta, st), states)
        q = torch.randn(batch, rows, r.value_heads, r.key_dim, device=self.device, dtype=self.dtype)
        v = torch.randn(batch, rows, r.value_heads, r.value_dim, device=self.device, dtype=self.dtype)
        gb, bb = g.expand(batch, -1, -1), beta.expand(batch, -1, -1)
        initial = torch.zeros(batch, r.value_heads, r.key_dim, r.value_dim, device=self.device)
        return time_call(lambda: gdn.recurrent_gated_delta_rule(q, q, v, gb, bb, initial, keep_states=True),
                         self.device, self.reps)

    @functools.lru_cache(maxsize=None)
    def accept(self, m: int, vocab: int) -> float:
        logits = torch.randn(m, vocab, device=self.device, dtype=self.dtype)
        return time_call(lambda: logits.argmax(dim=-1), self.device, self.reps)


def cost_report(target_dir, drafter_dir=None, batch: int = 1, block_size: int | None = None,
                tau: float | None = None, context: int = 1024, device: str | None = None,
                weights: str = "split12", quick: bool = False, ceilings: Ceilings | None = None,
                draft_vocab: int = 0, certified: tuple | None = None) -> CostReport:
    """draft_vocab / certified: the two-level mechanisms' terms (shapes.step_components); the tau
    stated must then be the one measured with them."""
    if batch < 1 or context < 1:
        raise ValueError(f"need batch >= 1 and context >= 1, got batch={batch}, context={context}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    target = ModelShape.from_dir(target_dir)
    if drafter_dir:                               # the step model below is DFlash's
        from specpilot.models.config import read_config_json
        from specpilot.models.drafters.kinds import detect_kind

        try:
            kind = detect_kind(read_config_json(drafter_dir), f"drafter {drafter_dir}")
        except ValueError:                        # a bare shape config: modelled as DFlash
            kind = "dflash"
        if kind != "dflash":
            raise ValueError(f"specpilot cost models DFlash drafters only; {drafter_dir} is a {kind} drafter "
                             f"(its draft step is not modelled yet)")
    drafter = ModelShape.from_dir(drafter_dir) if drafter_dir else None
    if drafter is not None:
        block_size = block_size or _drafter_block_size(drafter_dir)
        tau = tau if tau is not None else 4.3  # the zoo pair's measured tau (shared/zoo/README.md)
        if block_size < 2 or not 1.0 <= tau <= block_size:
            raise ValueError(f"need block_size >= 2 and 1 <= tau <= block_size, got {block_size}, {tau}")
    feats = drafter_target_layers(drafter_dir) if drafter_dir else 0
    comps = step_components(target, drafter, feats, batch, block_size or 1, context, weights, draft_vocab, certified)
    ceil = ceilings or measure_ceilings(device, quick=quick)
    meas = _Measurer(device, weights, reps=3 if device == "cpu" else 20)
    tokens = {"decode": float(batch), "draft": batch * (tau or 1.0), "verify": batch * (tau or 1.0)}
    rows = [_row(c, ceil, meas, target, drafter, batch, context, tokens[c.step], weights) for c in comps]
    if drafter is not None:
        rows.append(_knob_row(rows, block_size, tau))
    rows.sort(key=lambda r: r["lost_per_token_s"], reverse=True)
    deployment = {"target": target.name, "drafter": drafter.name if drafter else None, "batch": batch,
                  "block_size": block_size, "tau": tau, "tau_source": "stated" if drafter else None,
                  "context": context, "device": device, "device_name": ceil.device_name, "weights": weights,
                  "measured_dtype": ceil.dtype, "linear_impl": meas.linear_label(ceil.dtype),
                  "draft_vocab": draft_vocab, "certified_head": list(certified) if certified else None}
    return CostReport(deployment, ceil, rows, step_bounds(rows, tau))


def _drafter_block_size(drafter_dir) -> int:
    import json
    from pathlib import Path

    c = json.loads((Path(drafter_dir) / "config.json").read_text())
    return int((c.get("dflash_config") or {}).get("block_size") or c.get("block_size") or 16)


def _shape_of(c, target, drafter):
    return drafter if (c.step == "draft" and c.name.startswith("draft.") and c.name != "draft.lm_head") else target


def work(c, device: str, target, drafter, batch, context, weights) -> tuple:
    """(bytes, flops) a component must move and compute on `device`."""
    elem = _elem(device)
    shape = _shape_of(c, target, drafter)
    if c.kind == "linear":
        bpw = SPLIT12_BYTES_PER_WEIGHT if (weights == "split12" and device == "cuda") else elem
        return c.n * c.k * bpw + (c.m * c.k + c.m * c.n) * elem, 2.0 * c.m * c.n * c.k
    if c.kind == "attention":
        return c.extra[0] * elem / 2, 4.0 * batch * shape.heads * (c.m // batch) * context * shape.head_dim
    if c.kind == "recurrent":     # fp32 states; per row and value head: k.S, the rank-1 update, q.S
        r = shape.recurrent
        return c.extra[0], 6.0 * c.m * r.value_heads * r.key_dim * r.value_dim
    if c.kind == "accept":
        return c.m * c.n * elem, 0.0
    return 0.0, 0.0          # launches: the untimed kernels at the launch floor each, against one launch


def ceiling_of(nbytes: float, flops: float, ceil: Ceilings) -> tuple:
    """(seconds, what binds): max(bytes / copy bandwidth, flops / matmul rate, one launch)."""
    bounds = {"bandwidth": nbytes / ceil.copy_bandwidth, "compute": flops / ceil.matmul_flops, "launch": ceil.launch_s}
    bound = max(bounds, key=bounds.get)
    return bounds[bound], bound


def _row(c, ceil: Ceilings, meas: _Measurer, target, drafter, batch, context, tokens_per_step, weights) -> dict:
    shape = _shape_of(c, target, drafter)
    nbytes, flops = work(c, ceil.device, target, drafter, batch, context, weights)
    if c.kind == "linear":
        measured = meas.linear(c.m, c.n, c.k)
    elif c.kind == "attention":
        measured = meas.attention(batch, max(1, c.m // batch), shape.heads, shape.kv_heads, context, shape.head_dim)
    elif c.kind == "recurrent":
        measured = meas.recurrent(batch, max(1, c.m // batch), shape.recurrent)
    elif c.kind == "accept":
        measured = meas.accept(c.m, c.n)
    else:
        measured = c.extra[0] * ceil.launch_s
    ceiling, bound = ceiling_of(nbytes, flops, ceil)
    lost = max(0.0, measured - ceiling) * c.count / tokens_per_step
    agent_op = "split12_gemv" if (c.kind == "linear" and c.m == 1) else None
    shape_of = {"linear": [c.n, c.k] if agent_op else [c.m, c.n, c.k], "accept": [c.m, c.n], "launches": [c.extra[0] if c.extra else 0],
                "attention": [c.m, shape.heads, context, shape.head_dim],
                "recurrent": [c.m, *astuple(shape.recurrent)[1:]] if shape.recurrent else []}
    return {"key": f"{c.step}:{c.name}:{c.m}x{c.n}x{c.k}", "step": c.step, "name": c.name, "kind": c.kind,
            "op": agent_op or c.kind, "shape": shape_of[c.kind], "count": c.count,
            "measured_s": measured, "ceiling_s": ceiling, "bound": bound, "bytes": nbytes, "flops": flops,
            "lost_per_token_s": lost, "tokens_per_step": tokens_per_step, "actionable": agent_op is not None}


def step_bounds(rows, tau: float | None) -> dict:
    """steps: step -> {measured_s, ceiling_s}, its components summed (counts included). With a drafter,
    the ratios at the ceilings: verify / AR and draft / verify (at least these), and spec / AR at tau
    tokens per draft + verify step against one per AR step (at most this; batch cancels); spec / AR
    also from the components timed alone (no overlap between kernels, eager launches)."""
    steps = {}
    for r in rows:
        if r["kind"] != "knob":
            step = steps.setdefault(r["step"], {"measured_s": 0.0, "ceiling_s": 0.0})
            step["measured_s"] += r["measured_s"] * r["count"]
            step["ceiling_s"] += r["ceiling_s"] * r["count"]
    out = {"steps": steps}
    if "verify" in steps:
        decode, verify, draft = (steps[s] for s in ("decode", "verify", "draft"))
        out.update(verify_over_ar_at_ceiling=verify["ceiling_s"] / decode["ceiling_s"],
                   draft_over_verify_at_ceiling=draft["ceiling_s"] / verify["ceiling_s"],
                   spec_over_ar_at_ceiling=tau * decode["ceiling_s"] / (verify["ceiling_s"] + draft["ceiling_s"]),
                   spec_over_ar_measured=tau * decode["measured_s"] / (verify["measured_s"] + draft["measured_s"]))
    return out


def _knob_row(rows, block_size, tau) -> dict:
    """The draft + verify step as a whole: what the block size trades (longer blocks, more accepted)."""
    spec = [r for r in rows if r["step"] in ("draft", "verify")]
    lost = sum(r["lost_per_token_s"] for r in spec)
    return {"key": f"engine:block_size:{block_size}", "step": "spec", "name": "block_size", "kind": "knob",
            "op": "engine.block_size", "shape": [], "count": 1,
            "measured_s": sum(r["measured_s"] * r["count"] for r in spec),
            "ceiling_s": sum(r["ceiling_s"] * r["count"] for r in spec), "bound": "mixed", "bytes": 0.0,
            "flops": 0.0, "lost_per_token_s": lost, "tokens_per_step": None, "actionable": True, "block_size": block_size, "tau": tau}


def format_table(report: CostReport, limit: int = 30) -> str:
    d, c = report.deployment, report.ceilings
    total = sum(r["lost_per_token_s"] for r in report.rows if r["kind"] != "knob") or 1.0
    lines = [f"# cost model: {d['target']} + {d['drafter'] or 'no drafter'}, batch {d['batch']}, block "
             f"{d['block_size']}, tau {d['tau']} ({d['tau_source'] or 'AR'}), context {d['context']}",
             f"# device {c.device} ({c.device_name}), measured {c.dtype}: copy {c.copy_bandwidth / 1e9:.1f} GB/s, "
             f"matmul {c.matmul_flops / 1e9:.1f} GFLOP/s, launch {c.launch_s * 1e6:.2f} us"
             + ("  [CPU times against CPU ceilings]" if c.device == "cpu" else ""),
             f"{'#':>3} {'step':<7} {'component':<15} {'shape':<18} {'cnt':>4} {'meas us':>9} {'ceil us':>9} "
             f"{'bound':<9} {'lost us/tok':>11} {'share':>6} act"]
    for i, r in enumerate(report.rows[:limit], 1):
        shape = "x".join(map(str, r["shape"])) or "-"
        share = "" if r["kind"] == "knob" else f"{100 * r['lost_per_token_s'] / total:5.1f}%"
        lines.append(f"{i:>3} {r['step']:<7} {r['name']:<15} {shape:<18} {r['count']:>4} {r['measured_s'] * 1e6:>9.2f} "
                     f"{r['ceiling_s'] * 1e6:>9.2f} {r['bound']:<9} {r['lost_per_token_s'] * 1e6:>11.2f} {share:>6} "
                     f"{'yes' if r['actionable'] else ''}")
    return "\n".join(lines + _bounds_lines(report.bounds, d["tau"]))


def _bounds_lines(bounds: dict, tau) -> list:
    steps = bounds.get("steps", {})
    lines = ["# steps, components summed (timed alone / at the ceilings): " + ", ".join(
        f"{name} {s['measured_s'] * 1e3:.3f} / {s['ceiling_s'] * 1e3:.3f} ms" for name, s in steps.items())]
    if "spec_over_ar_at_ceiling" in bounds:
        lines.append(f"# every component at its ceiling: verify / AR >= {bounds['verify_over_ar_at_ceiling']:.3f}, "
                     f"draft / verify >= {bounds['draft_over_verify_at_ceiling']:.3f}, spec / AR <= "
                     f"{bounds['spec_over_ar_at_ceiling']:.2f}x at tau {tau} "
                     f"(components timed alone: {bounds['spec_over_ar_measured']:.2f}x)")
    return lines
