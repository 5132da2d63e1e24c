"""Our Gated DeltaNet chain kernel against fla's Triton kernel on the same card and inputs (GPU):

    python -m specpilot.bench.gdn_fla [--value-heads 32 --key-heads 16 --head-dim 128] [--out F.jsonl]

One layer's recurrence at the Qwen3.5-9B shape for T = 1 (decode), 4 and 16 (verify) tokens from a
committed state: ours (csrc/cuda/gdn_chain.cu, the state after every token written: the snapshots a
verify commits from) and fla's `fused_recurrent_gated_delta_rule` (fla-core from PyPI, q / k L2-normed
in the kernel, the final state only: it keeps no per-token states, so for T > 1 it does less work than
a verify needs and is a lower bound, not a like-for-like). Each beside its floor: the fp32 state read
once, the states written (ours: T of them; fla: one), q / k / v / gates read, the output written, over
the measured device-to-device copy bandwidth. The two outputs and final states are compared (bf16
outputs within rounding; fp32 states to 1e-3 relative), so a timing of a wrong kernel is not reported.
fla missing: its rows say so and ours still run.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def inputs(t: int, nk: int, hv: int, d: int, seed: int = 0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    mixed = torch.randn(t, 2 * nk * d + hv * d, device="cuda", generator=g).bfloat16()
    log_decay = -torch.rand(t, hv, device="cuda", generator=g) * 0.5
    beta = torch.rand(t, hv, device="cuda", generator=g)
    state = torch.randn(hv, d, d, device="cuda", generator=g) * 0.05
    return {"mixed": mixed, "g": log_decay, "beta": beta, "state": state}


def ours(x: dict, nk: int, d: int):
    from specpilot.kernels import gdn_chain

    t, hv = x["mixed"].shape[0], x["state"].shape[0]
    states = torch.empty(t, hv, d, d, dtype=torch.float32, device="cuda")
    return lambda: gdn_chain.gdn_chain(x["mixed"], nk, d, x["g"], x["beta"], x["state"], states)


def fla_call(x: dict, nk: int, d: int):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    t, hv = x["mixed"].shape[0], x["state"].shape[0]
    q = x["mixed"][:, :nk * d].reshape(1, t, nk, d).contiguous()
    k = x["mixed"][:, nk * d:2 * nk * d].reshape(1, t, nk, d).contiguous()
    v = x["mixed"][:, 2 * nk * d:].reshape(1, t, hv, d).contiguous()
    g, beta, h0 = x["g"][None].contiguous(), x["beta"][None].contiguous(), x["state"][None].contiguous()
    return lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)


def floor_ms(t: int, nk: int, hv: int, d: int, states_written: int, bandwidth: float) -> float:
    state = hv * d * d * 4
    io = t * (2 * nk * d + hv * d) * 2 + t * hv * 8 + t * hv * d * 2
    return (state * (1 + states_written) + io) / bandwidth * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--value-heads", type=int, default=32)
    p.add_argument("--key-heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--tokens", default="1,4,16")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gdn_fla times CUDA kernels: no GPU here")
    from specpilot.bench.device_rates import copy_bandwidth
    from specpilot.bench.step_times import _event_ms
    from specpilot.kernels import gdn_chain

    if not gdn_chain.available():
        raise SystemExit("this build has no gdn_chain CUDA op (build the extension with CUDA)")
    try:
        import fla  # noqa: F401
        have_fla = True
    except ImportError as e:
        have_fla, why = False, str(e)
    bandwidth = copy_bandwidth("cuda")
    nk, hv, d = a.key_heads, a.value_heads, a.head_dim
    rows = []
    for t in [int(s) for s in a.tokens.split(",")]:
        x = inputs(t, nk, hv, d)
        ours_fn = ours(x, nk, d)
        out, states = ours_fn()
        row = {"tokens": t, "ours_ms": _event_ms(ours_fn, a.iters),
               "ours_floor_ms": floor_ms(t, nk, hv, d, t, bandwidth), "fla_floor_ms": floor_ms(t, nk, hv, d, 1, bandwidth)}
        if have_fla:
            fla_fn = fla_call(x, nk, d)
            o_fla, h_fla = fla_fn()
            out_err = (o_fla[0].float() - out.float()).abs().max().item()
            state_rel = ((h_fla[0] - states[-1]).norm() / states[-1].norm()).item()
            row.update({"fla_ms": _event_ms(fla_fn, a.iters), "max_out_diff": out_err, "final_state_rel_diff": state_rel,
                        "agree": out_err <= 0.05 * max(out.float().abs().max().item(), 1.0) and state_rel < 1e-3})
            if not row["agree"]:
                row["fla_ms"] = None                  # a kernel that computes something else is not timed
        else:
            row["fla"] = f"not installed ({why})"
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| T | ours ms (T states) | its floor | fla ms (final state only) | its floor | agree |\n|---|---|---|---|---|---|")
    for r in rows:
        fla_ms = f"{r['fla_ms']:.4f}" if r.get("fla_ms") else "-"
        print(f"| {r['tokens']} | {r['ours_ms']:.4f} | {r['ours_floor_ms']:.4f} | {fla_ms} | {r['fla_floor_ms']:.4f} | "
              f"{r.get('agree', '-')} |")
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
