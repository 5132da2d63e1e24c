"""How many kernels each graphed step launches (H100/H200 probe for the cost model's launch counts):
the engine's AR, verify-16 and draft steps (shipped defaults, 512 tokens of context) profiled at two
target depths and two drafter depths, bf16 and split12 weights (target and drafter); per-layer and
fixed counts from the differences, and the kernels by name. One-off:

    python bench/probes/step_kernel_counts.py
"""
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from specpilot.engine import Engine
from specpilot.models.loading import swap_to_split12
from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

CONTEXT, BLOCK = 512, 16


def kernels(fn) -> dict:
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
def counts(target_layers: int, drafter_layers: int, weights: str) -> dict:
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
    out = {"ar": kernels(lambda: runner.target_step(prompt[:, -1:], CONTEXT, with_features=False)),
           "verify": kernels(lambda: runner.target_step(blk, CONTEXT, with_features=True)),
           "draft": kernels(lambda: runner.draft_step(feats[:, :4], CONTEXT - 4, blk, CONTEXT, BLOCK))}
    del engine, target, drafter
    torch.cuda.empty_cache()
    return out


def main() -> None:
    for weights in ("bf16", "split12"):
        report(weights, counts(2, 1, weights), counts(4, 2, weights))


def report(weights: str, small: dict, large: dict) -> None:
    for step, layers in (("ar", (2, 4)), ("verify", (2, 4)), ("draft", (1, 2))):
        a, b = sum(small[step].values()), sum(large[step].values())
        per_layer = (b - a) / (layers[1] - layers[0])
        print(f"{weights} {step}: {a} kernels at {layers[0]} layers, {b} at {layers[1]}: {per_layer:g} per layer, "
              f"{a - per_layer * layers[0]:g} fixed")
        for name, n in sorted(large[step].items(), key=lambda kv: -kv[1]):
            print(f"   {n:4d}  {name[:120]}")


if __name__ == "__main__":
    main()
