"""split12 bits/weight of random-init matrices at a preset's shapes (the scale tier's weights):

    python -m specpilot.bench.split12_bits --preset qwen3-8b [--rows 4096]

One matrix per distinct linear shape (QKV, O, gate/up, down, LM head), drawn the way
models/random_ckpt.py draws them (N(0, 1/K), rounded to bf16), packed in memory by the same
pack_tensor that `specpilot pack` uses. --rows caps the rows per matrix (bits/weight is a per-row
quantity: the base byte and the escapes are per row), so a CPU measures the 8B shapes in seconds.
Prints one line per shape, then a JSON line with the weighted total.
"""
import argparse
import json

import torch


def main(argv=None) -> int:
    from specpilot.formats.split12.pack import pack_tensor, summarize
    from specpilot.models.random_ckpt import TARGET_PRESETS

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.split12_bits", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b", choices=sorted(TARGET_PRESETS))
    p.add_argument("--rows", type=int, default=4096, help="rows drawn per matrix (0: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    c = TARGET_PRESETS[args.preset]
    q_out = c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim
    shapes = {"qkv": (q_out, c.hidden_size), "o": (c.hidden_size, c.num_heads * c.head_dim),
              "gate_up": (2 * c.intermediate_size, c.hidden_size), "down": (c.hidden_size, c.intermediate_size),
              "lm_head": (c.vocab_size, c.hidden_size)}
    gen = torch.Generator().manual_seed(args.seed)
    stats = []
    for name, (n, k) in shapes.items():
        rows = n if args.rows <= 0 else min(n, args.rows)
        w = (torch.randn((rows, k), generator=gen) / k ** 0.5).to(torch.bfloat16)
        s = pack_tensor(name, w)[1]
        stats.append(s)
        print(f"{name:<8} {n}x{k} (rows drawn {rows}): {s.bits_per_weight:.4f} bits/weight, "
              f"{s.escapes} escapes, {s.distinct_exponents} exponents")
    print(json.dumps({"preset": args.preset, "rows_per_matrix": args.rows, **summarize(stats)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
