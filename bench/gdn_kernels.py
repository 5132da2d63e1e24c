"""The Gated DeltaNet recurrence kernels alone at a layer's shape (GPU): the chain kernel over T tokens
and its tree form over N nodes (chain-shaped, and a best-first bushy tree), per launch, against the
floor of the bytes they must move (the state read, the T per-token fp32 snapshots written, q/k/v in,
o out) over the card's copy bandwidth:

    python -m specpilot.bench.gdn_kernels [--heads 16,32] [--dims 128,128] [--tokens 1,16,32,64] [--out F.json]

Defaults: one Qwen3.5-9B GDN layer (16 key / 32 value heads of 128). Reported per T: chain_us,
tree_chain_us (the tree op on parents i - 1), tree_bushy_us (engine/tree/build.py's tree from random
draft logits), floor_us, snapshot_tb_s (the snapshot bytes over chain_us: the write rate the
snapshots get).
"""
from __future__ import annotations

import argparse
import json

import torch


def layer_inputs(t, nk, hv, dk, dv):
    mixed = torch.randn(t, 2 * nk * dk + hv * dv, device="cuda").to(torch.bfloat16)
    decay = -torch.rand(t, hv, device="cuda") * 2
    beta = torch.rand(t, hv, device="cuda")
    state = torch.randn(hv, dk, dv, device="cuda") * 0.1
    return mixed, decay, beta, state


def bushy_parents(t, vocab: int = 4096, seed: int = 0):
    from specpilot.engine.tree.build import build_tree

    g = torch.Generator().manual_seed(seed)
    tree = build_tree(torch.randn(15, vocab, generator=g) * 4, 0, t)
    return torch.tensor(tree.parents, device="cuda")


@torch.inference_mode()
def kernel_times(t, nk, hv, dk, dv, bandwidth, iters: int = 50) -> dict:
    from specpilot.bench.step_times import _event_ms

    ops = torch.ops.specpilot
    mixed, decay, beta, state = layer_inputs(t, nk, hv, dk, dv)
    states = torch.empty(t, hv, dk, dv, device="cuda")
    out = torch.empty(t, hv, dv, device="cuda", dtype=torch.bfloat16)
    chain = lambda: ops.gdn_chain(mixed, nk, dk, decay, beta, state, states, out)  # noqa: E731
    out_row = {"tokens": t, "chain_us": 1e3 * _event_ms(chain, iters)}
    if t <= 64:
        for name, parents in (("tree_chain_us", torch.arange(-1, t - 1, device="cuda")),
                              ("tree_bushy_us", bushy_parents(t))):
            out_row[name] = 1e3 * _event_ms(lambda: ops.gdn_tree(mixed, nk, dk, decay, beta, state, parents, states,
                                                                 out), iters)
    snapshot_bytes = states.numel() * 4
    moved = state.numel() * 4 + snapshot_bytes + mixed.numel() * 2 + out.numel() * 2 + 2 * decay.numel() * 4
    out_row["floor_us"] = 1e6 * moved / bandwidth
    out_row["snapshot_tb_s"] = snapshot_bytes / (out_row["chain_us"] * 1e-6) / 1e12
    return out_row


def main(argv=None) -> int:
    from specpilot.bench.device_rates import copy_bandwidth
    from specpilot.kernels import gdn_chain, gdn_tree

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.gdn_kernels", description=__doc__.split("\n")[0])
    p.add_argument("--heads", default="16,32", help="key heads,value heads")
    p.add_argument("--dims", default="128,128", help="key head dim,value head dim")
    p.add_argument("--tokens", default="1,16,32,64")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gdn_kernels times CUDA kernels: it needs a GPU")
    if not (gdn_chain.available() and gdn_tree.available()):
        raise SystemExit("the extension was built without the GDN ops (a CUDA build of specpilot._C is needed)")
    nk, hv = (int(x) for x in args.heads.split(","))
    dk, dv = (int(x) for x in args.dims.split(","))
    bandwidth = copy_bandwidth("cuda")
    out = {"device": torch.cuda.get_device_name(), "heads": [nk, hv], "dims": [dk, dv],
           "copy_tb_s": bandwidth / 1e12,
           "steps": [kernel_times(int(t), nk, hv, dk, dv, bandwidth, args.iters) for t in args.tokens.split(",")]}
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
