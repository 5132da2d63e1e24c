"""`specpilot pack SRC_DIR DST_DIR`: HF bf16 checkpoint folder -> split12 folder (bit-exact)."""
import json


def configure(parser):
    parser.add_argument("src", help="HF folder with model.safetensors or model.safetensors.index.json")
    parser.add_argument("dst", help="output folder (written atomically)")
    parser.add_argument("--max-bits", type=float, default=None,
                        help="matrices costing more bits/weight than this stay bf16 (default 14.0)")
    parser.add_argument("--overwrite", action="store_true", help="replace dst if it exists")


def run(args) -> int:
    from specpilot.formats.split12 import io, pack

    max_bits = pack.DEFAULT_MAX_BITS if args.max_bits is None else args.max_bits
    summary = io.pack_folder(args.src, args.dst, max_bits_per_weight=max_bits, overwrite=args.overwrite)
    print(f"packed {summary['tensors']} matrices into {args.dst}: {summary['bits_per_weight']:.4f} bits/weight, "
          f"{summary['escapes']} escapes; kept bf16: {len(summary['kept_bf16'])}")
    print(json.dumps(summary))
    return 0
