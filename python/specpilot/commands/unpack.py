"""`specpilot unpack SRC DST`: split12 folder -> bf16 safetensors folder, bit-exact."""


def configure(parser):
    parser.add_argument("src", help="split12 folder (from `specpilot pack`)")
    parser.add_argument("dst", help="output folder (written atomically)")
    parser.add_argument("--overwrite", action="store_true", help="replace dst if it exists")


def run(args) -> int:
    from specpilot.formats.split12 import io

    count = io.unpack_folder(args.src, args.dst, overwrite=args.overwrite)
    print(f"unpacked {count} split12 matrices into {args.dst}")
    return 0
