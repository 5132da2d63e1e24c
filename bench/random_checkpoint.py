"""Write a random-weight target + drafter pair to disk in HF / the drafter's published format (scale tier):

    python -m specpilot.bench.random_checkpoint --preset qwen3-8b --out DIR [--device cuda]
        [--drafter-kind {dflash,dflash2,dspark,pard}]

--drafter-kind (default dflash) picks the drafter; on an 8B preset the new kinds take their published
scale shapes (models/drafters/random_kinds.py SCALE_SHAPES: DFlash2 block 8 with 5 layers, DSpark
block 7 with 5 layers and Markov rank 256, PARD a Qwen3-0.6B-shaped model drafting 12 tokens).
--block-size is the engine's verify block (anchor + drafts; default: 16 DFlash, 8 DFlash2 / DSpark,
13 PARD).

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
    p.add_argument("--block-size", type=int, default=None, help="verify block (anchor + drafts); default per kind")
    p.add_argument("--drafter-kind", default="dflash", choices=("dflash", "dflash2", "dspark", "pard"))
    p.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda is much faster)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs-only", action="store_true", help="write the config.json files, no weights")
    args = p.parse_args(argv)
    layers = args.drafter_layers or (2 if args.preset.startswith("tiny") else 5)
    block = args.block_size or {"dflash": 16, "dflash2": 8, "dspark": 8, "pard": 13}[args.drafter_kind]
    if args.drafter_kind != "dflash":
        return _write_kind(args, layers, block)
    args.block_size = block
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


def _write_kind(args, layers: int, block: int) -> int:
    import torch

    from specpilot.models.drafters.random_kinds import SCALE_SHAPES, write_kind_pair

    if args.configs_only:
        raise ValueError(f"--configs-only writes DFlash configs only, not {args.drafter_kind}")
    options = dict(drafter_layers=layers, block_size=block)
    if "8b" in args.preset:
        options.update(SCALE_SHAPES[args.drafter_kind])
        if args.block_size:
            options["block_size"] = args.block_size
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    start = time.time()
    tdir, ddir = write_kind_pair(args.out, args.drafter_kind, args.preset, seed=args.seed, dtype=dtype,
                                 max_shard_bytes=4 << 30, device=args.device, **options)
    print(f"target  {tdir}\ndrafter {ddir} ({args.drafter_kind})\nwritten in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
