"""How many kernels one decode step of a hybrid target launches, by part, with the elementwise forms of
ops/zero_centred.py (EngineConfig.fused_kernels on) and without (off: the op-for-op references):

    python -m specpilot.bench.hybrid_kernel_counts [--device cpu|cuda] [--preset P] [--layers N] [--tokens T]

cpu (the default without a GPU; bf16, tiny-qwen3.5): counts the aten ops one eager forward of T tokens
(after a prefill) dispatches, views and allocations left out (every other op launches at least one kernel
on a GPU), by part: each layer's attn_norm / mixer / mlp_norm / mlp module (GDN and attention layers
apart), the final norm, and the rest of the step (embedding, RoPE rows, residual adds outside the fused
norm, LM head). On the CPU the GDN mixer runs its torch reference where the GPU runs two or three fused
kernels (kernels/gdn_fused.py, gdn_chain.py) and our fused CUDA ops are absent, so the mixer and MLP rows
are not the GPU's; the norms, the attention mixer and the residual adds are counted as the GPU runs them
without our CUDA norm kernel (torch's rms_norm is one op; with the kernel a norm and its add are one).
cuda: the CUDA kernels of one graphed AR (T = 1) and verify (T = --block) step by name, from the profiler
(bench/kernel_counts.py's method), at the preset's shape with --layers layers, in three modes: "on" (the
defaults), "before" (the GDN and SiLU kernels but neither these forms nor the one-token GEMVs: the hybrid
step before them) and "off" (fused_kernels off: every reference).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that allocate or only move metadata: no kernel of their own.
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach",
             "detach_", "resize_", "_local_scalar_dense", "set_", "sym_size", "sym_stride", "sym_numel", "dim"}
# Ops that return a view when they can (counted only when they copied).
MAY_VIEW = {"reshape", "contiguous", "to", "flatten", "unflatten", "_unsafe_view"}


def _storage(t):
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


def launches(func, args, out) -> bool:
    """Whether a dispatched aten op runs a kernel: not an allocation, and not a view (an op that may
    return a view, as reshape or to, counts when it copied)."""
    if func.overloadpacket.__name__ in NO_KERNEL:
        return False
    if func.is_view or func.overloadpacket.__name__ in MAY_VIEW:
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        outs = out if isinstance(out, (list, tuple)) else [out]
        return first is not None and any(_storage(o) not in (None, _storage(first)) for o in outs)
    return True


class _Counter(TorchDispatchMode):
    """Counts kernel-launching aten ops by the label of the module running them (module hooks set it)."""

    def __init__(self):
        super().__init__()
        self.label, self.stack, self.counts = "step", [], collections.Counter()
        self.names = collections.defaultdict(collections.Counter)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if launches(func, args, out):
            self.counts[self.label] += 1
            self.names[self.label][func.overloadpacket.__name__] += 1
        return out


def _labels(model) -> dict:
    """module -> label: "gdn.mixer", "attention.attn_norm", ... (layer kinds pooled), "final_norm"."""
    out = {model.norm: "final_norm", model.lm_head: "step"}
    for layer in model.layers:
        kind = "gdn" if layer.recurrent else "attention"
        for part in ("attn_norm", "mixer", "mlp_norm", "mlp"):
            out[getattr(layer, part)] = f"{kind}.{part}"
    return out


@contextlib.contextmanager
def _labelled(model, counter):
    """Within the block, each labelled module's entry points (forward, and a norm's add_norm, which the
    model calls directly) run under its label."""
    def labelled(method, label):
        def run(*args, **kwargs):
            counter.stack.append(counter.label)
            counter.label = label
            try:
                return method(*args, **kwargs)
            finally:
                counter.label = counter.stack.pop()
        return run

    patched = []
    for module, label in _labels(model).items():
        for name in ("forward", "add_norm"):
            if hasattr(module, name):
                setattr(module, name, labelled(getattr(module, name), label))
                patched.append((module, name))
    try:
        yield
    finally:
        for module, name in patched:
            delattr(module, name)


def cpu_counts(preset: str = "tiny-qwen3.5", tokens: int = 1, layers: int | None = None, seed: int = 0) -> dict:
    """{"on": ..., "off": ...}, each {"per_layer": {part: ops per layer of that kind}, "step": ops outside
    the layers, "final_norm": ..., "total": ..., "names": {part: {op: count}}} for one bf16 CPU forward of
    `tokens` tokens after a 16-token prefill."""
    from specpilot import config
    from specpilot.engine.recurrent_state import HybridCache
    from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

    cfg = HYBRID_PRESETS[preset]
    if layers is not None:
        cfg = dataclasses.replace(cfg, layer_types=cfg.layer_types[:layers])
    if not cfg.attention_layers or not cfg.gdn_layers:
        raise ValueError(f"{preset} with {cfg.num_layers} layers needs GDN and attention layers to count both")
    model = random_target(cfg, "cpu", torch.bfloat16, seed=seed)
    model.ensure_rope(64)
    ids = torch.randint(0, cfg.vocab_size, (1, 16 + tokens), generator=torch.Generator().manual_seed(seed))
    kinds = {"gdn": len(cfg.gdn_layers), "attention": len(cfg.attention_layers)}
    out = {}
    for on in (True, False):
        with config.use(dataclasses.replace(config.current(), fused_kernels=on)), torch.inference_mode():
            cache = HybridCache(cfg, 1, 64, "cpu", torch.bfloat16)
            model(ids[:, :16], torch.arange(16), cache, 16)
            counter = _Counter()
            with _labelled(model, counter), counter:
                model(ids[:, 16:], torch.arange(16, 16 + tokens), cache, 16 + tokens)
        per_layer = {label: n / kinds[label.split(".")[0]] for label, n in counter.counts.items() if "." in label}
        out["on" if on else "off"] = {"per_layer": per_layer, "step": counter.counts["step"],
                                      "final_norm": counter.counts["final_norm"],
                                      "total": sum(counter.counts.values()),
                                      "names": {k: dict(v) for k, v in counter.names.items()}}
    return out


@contextlib.contextmanager
def _without_zero_centred():
    """Within the block, ops/zero_centred.py's forms never take a call (the references run)."""
    from specpilot.ops import zero_centred

    takes = zero_centred.takes
    zero_centred.takes = lambda x: False
    try:
        yield
    finally:
        zero_centred.takes = takes


def cuda_counts(preset: str = "qwen3.5-9b", layers: int | None = 8, block: int = 16, context: int = 512) -> dict:
    """{"on"/"before"/"off": {"ar"/"verify": {kernel name: launches}}}: one graphed step each, by the
    profiler (the modes: the module's docstring)."""
    from specpilot.bench.kernel_counts import _kernels
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

    cfg = HYBRID_PRESETS[preset]
    if layers is not None:
        cfg = dataclasses.replace(cfg, layer_types=cfg.layer_types[:layers])
    target = random_target(cfg, "cuda", torch.bfloat16, seed=0)
    modes = {"on": (EngineConfig(), contextlib.nullcontext),
             "before": (EngineConfig(fused_gemv=False), _without_zero_centred),
             "off": (EngineConfig(fused_kernels=False), contextlib.nullcontext)}
    out = {}
    for mode, (engine_config, context_manager) in modes.items():
        engine = Engine(target, None, max_seq_len=context + 2 * block + 64, config=engine_config)
        runner = engine.runner
        prompt = torch.randint(0, cfg.vocab_size - 2, (1, context), device="cuda")
        with torch.inference_mode(), context_manager():
            runner.prefill(prompt, with_features=False)
            blk = prompt[:, -block:].clone()
            out[mode] = {"ar": _kernels(lambda: runner.target_step(prompt[:, -1:], context, with_features=False)),
                         "verify": _kernels(lambda: runner.target_step(blk, context, with_features=False))}
        del engine
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.hybrid_kernel_counts", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--preset", default=None, help="tiny-qwen3.5 on the CPU, qwen3.5-9b on CUDA by default")
    p.add_argument("--layers", type=int, default=None, help="the preset's first N layers (CUDA default 8)")
    p.add_argument("--tokens", type=int, default=1, help="CPU: tokens of the counted forward")
    p.add_argument("--block", type=int, default=16, help="CUDA: the verify step's tokens")
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    if args.device == "cpu":
        result = cpu_counts(args.preset or "tiny-qwen3.5", args.tokens, args.layers)
        for mode, row in result.items():
            parts = ", ".join(f"{k} {v:g}" for k, v in sorted(row["per_layer"].items()))
            print(f"fused_kernels {mode}: {row['total']} ops per step; per layer: {parts}; "
                  f"final norm {row['final_norm']}, rest {row['step']}")
    else:
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda needs a CUDA device")
        result = cuda_counts(args.preset or "qwen3.5-9b", 8 if args.layers is None else args.layers, args.block)
        for mode, steps in result.items():
            for step, names in steps.items():
                print(f"fused_kernels {mode} {step}: {sum(names.values())} kernels")
                for name, n in sorted(names.items(), key=lambda kv: -kv[1]):
                    print(f"   {n:4d}  {name[:120]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
