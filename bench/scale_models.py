"""Scale-tier models for the engine benchmarks: random weights at a real preset's shapes, on the GPU.

- `scale_pair(preset)`: a bf16 target and a 5-layer drafter (dflash's layer spacing: Qwen3-8B gets
  target_layer_ids [1, 9, 17, 25, 33], as the public Qwen3-8B drafter).
- `to_split12(target, drafter)`: both swapped to split12 linears that share ONE packed copy per
  projection (layer 0's), plus the target's own packed LM head and the drafter's packed fc. Packing
  8B weights on the CPU takes minutes; sharing planes keeps the bytes each step reads identical to a
  fully packed model (36 x ~400 MB per projection does not fit in L2), so the step times are real.
- `weight_bytes(target)` and HBM_BYTES_PER_S: the weight-bandwidth floor of a decode step.
"""
from __future__ import annotations

import torch

HBM_BYTES_PER_S = 4.3e12      # H200 HBM3e, nominal: the issue's floor (the H100's HBM3 is 3.35e12)
TARGET_LINEARS = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")
DRAFTER_LINEARS = ("attn.q", "attn.kv", "attn.o", "mlp.gate_up", "mlp.down")


def scale_pair(preset: str = "qwen3-8b"):
    """(target, drafter) of `preset` with random bf16 weights on the GPU (seeds 0 and 1)."""
    from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

    if preset not in TARGET_PRESETS:
        raise SystemExit(f"unknown preset {preset!r}; choose from {sorted(TARGET_PRESETS)}")
    cfg = TARGET_PRESETS[preset]
    target = random_target(cfg, "cuda", torch.bfloat16, seed=0)
    return target, random_drafter(drafter_config_for(cfg, num_layers=5, block_size=16), target, seed=1)


def weight_bytes(target) -> int:
    """Bytes of all the target's weights (tied ones once): the issue's floor definition (Qwen3-8B:
    16.4 GB / 4.3e12 B/s = 3.8 ms). A decode step reads one embedding row, so the true floor is lower
    by the embedding table when it is not tied."""
    seen, total = set(), 0
    for p in target.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    for m in target.modules():                     # split12 modules keep their planes in buffers
        if not isinstance(m, torch.nn.Linear) and m is not target:
            total += sum(b.numel() * b.element_size() for b in m.buffers(recurse=False))
    return total


def shared_plane_split12(model, names=TARGET_LINEARS, lm_head: bool = True) -> dict:
    """`model`'s decoder-layer linears `names` swapped for Split12Linear modules sharing layer 0's
    packed planes per projection, and (lm_head) its own packed LM head; bits/weight per projection."""
    from specpilot.formats.split12.linear import Split12Linear
    from specpilot.formats.split12.ops import pack

    first = model.layers[0]
    packed = {n: pack(first.get_submodule(n).weight.data) for n in names}
    for layer in model.layers:
        for n in names:
            parent, _, child = n.rpartition(".")
            setattr(layer.get_submodule(parent), child, Split12Linear(packed[n]))
    if lm_head:
        model.lm_head = Split12Linear(pack(model.lm_head.weight.data))
    torch.cuda.empty_cache()
    return {n: round(p.bits_per_weight(), 3) for n, p in packed.items()}


def to_split12(target, drafter) -> dict:
    """The pair on split12 weights, as the engine runs a split12 checkpoint (the drafter's linears
    split12 too; its LM head is the target's). Returns bits/weight per projection."""
    from specpilot.formats.split12.linear import Split12Linear

    bits = shared_plane_split12(target)
    bits.update({f"drafter.{k}": v for k, v in shared_plane_split12(drafter, DRAFTER_LINEARS, lm_head=False).items()})
    drafter.fc = Split12Linear.from_weight(drafter.fc.weight.data)
    return bits
