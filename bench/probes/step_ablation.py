"""Upper bounds on what fusing a kernel away could save (H200, timing only, outputs are garbage):
the engine's graphed steps with one kind of multi-row kernel replaced by nothing (a tensor taken
from the allocator, no launch), beside the unchanged engine, alternated in one process. One-token
steps keep every kernel, so the AR column is the drift control. One-off experiment, not part of
the package:

    python bench/probes/step_ablation.py [--context 512] [--reps 2] [--drop silu_mul,rope,norm,attention,all]

What a drop removes (rows > 1 only: the verify and draft blocks):
  silu_mul   the SwiGLU gate kernel between gate_up and down
  rope       qk_norm_rope_cache (q/k norm, rope, cache write)
  norm       add_rms_norm (both per block, and the final norm)
  attention  the split + combine attention kernels
  all        silu_mul + rope + norm
and one that adds work back, for the A/B of the lazily built attention mask (every step):
  mask_eager the additive attention mask built in every forward, as before it was built on first use
"""
import argparse
import contextlib
import json


from specpilot.models import drafter as drafter_mod, layers, target as target_mod


def _rows(x) -> int:
    return x.numel() // x.shape[-1]


def _silu_mul(real):
    def fn(gate_up):
        if _rows(gate_up) == 1:
            return real(gate_up)
        return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    return fn


def _rope(real):
    def fn(q, k, v, *args, **kw):
        if q.shape[0] * q.shape[1] == 1:
            return real(q, k, v, *args, **kw)
        b, t, hq, d = q.shape
        return q.new_empty(b, hq, t, d)
    return fn


def _norm(real):
    def fn(x, delta, weight, eps):
        if _rows(x) == 1:
            return real(x, delta, weight, eps)
        return x, x.new_empty(x.shape)
    return fn


def _attend(real):
    def fn(q, k, v, mask, scale):
        b, hq, t, d = q.shape
        if t == 1:
            return real(q, k, v, mask, scale)
        return q.new_empty(b, t, hq * d)
    return fn


def _mask_eager(real):
    return lambda *args, **kw: real(*args, **kw).built()


PATCHES = {"silu_mul": [(layers, "silu_mul", _silu_mul)],
           "rope": [(target_mod, "qk_norm_rope_cache", _rope)],
           "norm": [(layers, "add_rms_norm", _norm), (target_mod, "add_rms_norm", _norm)],
           "attention": [(target_mod, "attend", _attend)],
           "mask_eager": [(target_mod, "attention_mask", _mask_eager), (drafter_mod, "attention_mask", _mask_eager)]}
PATCHES["all"] = PATCHES["silu_mul"] + PATCHES["rope"] + PATCHES["norm"]


@contextlib.contextmanager
def dropped(name):
    saved = []
    try:
        for module, attr, wrap in PATCHES.get(name, []):
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, wrap(getattr(module, attr)))
        yield
    finally:
        for module, attr, real in reversed(saved):
            setattr(module, attr, real)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--drop", default="silu_mul,rope,norm,attention,all")
    args = p.parse_args()

    from specpilot.bench.gpu_engine import fresh_engine_steps, scale_pair, use_best_kernels

    target, drafter = scale_pair("qwen3-8b")
    use_best_kernels()
    rows = []
    for _ in range(args.reps):
        for name in ["none"] + args.drop.split(","):
            with dropped(name):
                steps = fresh_engine_steps(target, drafter, args.iters, context=args.context)
            rows.append({"drop": name, **{k: steps[k] for k in ("ar_ms", "verify_ms", "draft_ms")}})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nqwen3-8b, random weights, bf16, config 8, {args.context} tokens of context; timing only")
    print("| variant | AR ms | verify16 ms | draft ms |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['drop']} | {r['ar_ms']:.3f} | {r['verify_ms']:.3f} | {r['draft_ms']:.3f} |")


if __name__ == "__main__":
    main()
