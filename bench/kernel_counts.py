"""How many kernels the engine's graphed steps launch, per layer and per step (a GPU check of the cost
model's launch counts, cost/shapes.UNTIMED_KERNELS):

    python -m specpilot.bench.kernel_counts

Profiles the AR, verify-16 and draft steps (shipped defaults, 512 tokens of context, Qwen3-8B widths)
at two target depths (2 and 4 layers, a 1-layer drafter) and two drafter depths (1 and 2 layers on
the 4-layer target), bf16 and split12 weights (target and drafter); per-layer and fixed counts come
from the differences. Prints them, with the kernels by name. Hybrid targets: bench/hybrid_kernel_counts.py.
"""
from dataclasses import replace

import torch

CONTEXT, BLOCK = 512, 16
# Kernels per layer that the cost model times as components: 4 linears (QKV, O, gate/up, down) and
# the attention's split + combine; the drafter's layer also runs its block's K/V apart from its Q
# and projects the context's K/V (cost/shapes.py: draft.qkv stands for q + block K/V, draft.ctx_kv).
TIMED_PER_LAYER = {"ar": 6, "verify": 6, "draft": 8}


def _kernels(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")):
            names[e.name] = names.get(e.name, 0) + 1
    return names


@torch.inference_mode()
def step_kernels(target_layers: int, drafter_layers: int, weights: str) -> dict:
    """step ("ar", "verify", "draft") -> {kernel name: launches} of one graphed step."""
    from specpilot.engine import Engine
    from specpilot.models.loading import swap_to_split12
    from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

    cfg = replace(TARGET_PRESETS["qwen3-8b"], num_layers=target_layers)
    target = random_target(cfg, "cuda", torch.bfloat16, seed=0)
    drafter = random_drafter(drafter_config_for(cfg, num_layers=drafter_layers, block_size=BLOCK), target, seed=1)
    if weights == "split12":
        swap_to_split12(target)
        swap_to_split12(drafter)
    engine = Engine(target, drafter, max_seq_len=1024)
    runner = engine.runner
    prompt = torch.randint(0, 1000, (1, CONTEXT), device="cuda")
    runner.prefill(prompt, with_features=True)
    blk = prompt[:, -BLOCK:].clone()
    feats = torch.zeros(1, BLOCK, len(runner.feature_layers) * cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    out = {"ar": _kernels(lambda: runner.target_step(prompt[:, -1:], CONTEXT, with_features=False)),
           "verify": _kernels(lambda: runner.target_step(blk, CONTEXT, with_features=True)),
           "draft": _kernels(lambda: runner.draft_step(feats[:, :4], CONTEXT - 4, blk, CONTEXT, BLOCK))}
    del engine, target, drafter
    torch.cuda.empty_cache()
    return out


def counts(weights: str) -> dict:
    """step -> (kernels per layer, kernels per step besides the layers, kernels by name at the deeper model)."""
    shallow, deep, deep_drafter = step_kernels(2, 1, weights), step_kernels(4, 1, weights), step_kernels(4, 2, weights)
    out = {}
    # step -> (the two runs, and the depth each profiled: the target's, or for the draft the drafter's)
    for step, (a, b, depth_a, depth_b) in {"ar": (shallow, deep, 2, 4), "verify": (shallow, deep, 2, 4),
                                           "draft": (deep, deep_drafter, 1, 2)}.items():
        n_a, n_b = sum(a[step].values()), sum(b[step].values())
        per_layer = (n_b - n_a) // (depth_b - depth_a)
        out[step] = (per_layer, n_a - per_layer * depth_a, b[step])
    return out


def main() -> None:
    for weights in ("bf16", "split12"):
        for step, (per_layer, fixed, names) in counts(weights).items():
            print(f"{weights} {step}: {per_layer} kernels per layer ({TIMED_PER_LAYER[step]} timed as components), "
                  f"{fixed} besides the layers")
            for name, n in sorted(names.items(), key=lambda kv: -kv[1]):
                print(f"   {n:4d}  {name[:120]}")


if __name__ == "__main__":
    main()
