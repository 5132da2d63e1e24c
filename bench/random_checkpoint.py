"""Write a random-weight target + DFlash drafter pair to disk in HF / DFlash format (scale tier):

    python -m specpilot.bench.random_checkpoint --preset qwen3-8b --out DIR [--device cuda]

Stock dflash and HF transformers need a folder to load; our engine's `random:<preset>` targets do
not. The folder holds DIR/target (config, sharded safetensors, a byte-level tokenizer) and
DIR/drafter. Prints the two paths and the seconds it took. --configs-only writes the two config.json
files alone: all that `specpilot cost` reads.
"""
import argparse
import time


def main(argv=None) -> int:
    import torch

    from specpilot.models.random_ckpt import TARGET_PRESETS, write_configs, write_pair

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.random_checkpoint", description=__doc__.split("\n")[0])
    p.add_argument("--preset", required=True, choices=sorted(TARGET_PRESETS))
    p.add_argument("--out", required=True)
    p.add_argument("--drafter-layers", type=int, default=None, help="default: 2 for tiny presets, else 5")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda is much faster)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs-only", action="store_true", help="write the config.json files, no weights")
    args = p.parse_args(argv)
    layers = args.drafter_layers or (2 if args.preset.startswith("tiny") else 5)
    if args.configs_only:
        tdir, ddir, _, _ = write_configs(args.out, args.preset, drafter_layers=layers, block_size=args.block_size)
        print(f"target  {tdir}\ndrafter {ddir}\n(configs only)")
        return 0
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    start = time.time()
    tdir, ddir = write_pair(args.out, args.preset, drafter_layers=layers, block_size=args.block_size,
                            seed=args.seed, dtype=dtype, max_shard_bytes=4 << 30, device=args.device)
    print(f"target  {tdir}\ndrafter {ddir}\nwritten in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
