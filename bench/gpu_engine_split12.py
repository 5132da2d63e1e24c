"""split12 rows of bench/gpu_engine.py: the engine with weights="split12" on the H200.

- `shared_plane_split12(target)`: the random 8B-shape target with every decoder layer's linears
  swapped for Split12Linear modules that share ONE packed copy per projection (layer 0's), plus
  its own packed LM head. Packing 8B weights on the CPU would take minutes; sharing planes keeps
  the bytes each step reads identical to a fully packed model (every layer still streams its
  matrices: 36 x ~400 MB does not fit in L2), so the step times are the real ones.
  `split12_drafter(drafter)`: the same for the drafter's layers (5 x ~400 MB: also past L2) and fc.
- `twin_check(...)`: zoo pair, split12 target vs its Bf16Linear twin (same kernels): graphed AR
  (simt) and verify (tc) logits compared bit for bit over a few steps.
Exactness: Split12Linear == Bf16Linear bit for bit under each kernel (formats/split12/ops.py).
"""
from __future__ import annotations

import torch


TARGET_LINEARS = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")
DRAFTER_LINEARS = ("attn.q", "attn.kv", "attn.o", "mlp.gate_up", "mlp.down")


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


def split12_drafter(drafter) -> dict:
    """The drafter's layer linears on shared split12 planes, and its fc packed (its LM head is the
    target's)."""
    from specpilot.formats.split12.linear import Split12Linear

    bits = shared_plane_split12(drafter, DRAFTER_LINEARS, lm_head=False)
    drafter.fc = Split12Linear.from_weight(drafter.fc.weight.data)
    return bits


@torch.inference_mode()
def twin_check(zoo_dirs, steps: int = 4, context: int = 200) -> dict:
    """Bit-identical logits of the split12 engine and its bf16 twin (graphed AR T=1 and verify T=16)."""
    from specpilot.engine import Engine
    from specpilot.formats.split12.linear import swap_linears
    from specpilot.models import load_drafter, load_target

    tdir, ddir = zoo_dirs
    s12 = load_target(tdir, device="cuda", dtype=torch.bfloat16, weights="split12")
    twin = load_target(tdir, device="cuda", dtype=torch.bfloat16)
    swap_linears(twin, kind="bf16")
    engines = [Engine(m, load_drafter(ddir, m), max_seq_len=512) for m in (s12, twin)]
    gen = torch.Generator(device="cuda").manual_seed(int(torch.randint(0, 2**31, ()).item()))
    prompt = torch.randint(0, s12.config.vocab_size - 2, (1, context), device="cuda", generator=gen)
    out = {"ar_steps": steps, "verify_steps": steps, "ar_identical": 0, "verify_identical": 0,
           "max_abs_diff": 0.0}
    for e in engines:
        e.runner.prefill(prompt, with_features=True)
    for i in range(steps):
        ids = torch.randint(0, s12.config.vocab_size - 2, (1, 16), device="cuda", generator=gen)
        pos = context + 16 * i
        a = [e.runner.target_step(ids[:, :1], pos, with_features=False)[0].clone() for e in engines]
        v = [e.runner.target_step(ids, pos, with_features=True)[0].clone() for e in engines]
        out["ar_identical"] += bool(torch.equal(a[0], a[1]))
        out["verify_identical"] += bool(torch.equal(v[0], v[1]))
        out["max_abs_diff"] = max(out["max_abs_diff"], float((a[0].float() - a[1].float()).abs().max()),
                                  float((v[0].float() - v[1].float()).abs().max()))
    out["passed"] = out["ar_identical"] == steps and out["verify_identical"] == steps
    kinds = {type(m).__name__ for m in s12.modules()}
    out["split12_modules"] = "Split12Linear" in kinds
    return out
