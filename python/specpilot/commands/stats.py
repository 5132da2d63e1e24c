"""`specpilot stats DIR`: per-tensor exponent coverage, escapes and bits/weight of a split12 folder,
or of a bf16 folder as it would pack. The last line is one JSON object (bits_per_weight, escapes,
tensors, ...)."""
import json


def configure(parser):
    parser.add_argument("dir", help="a split12 folder or an HF bf16 folder")
    parser.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args) -> int:
    from specpilot.formats.split12 import io, pack

    stats = io.folder_stats(args.dir)
    if not args.quiet:
        print(f"{'tensor':<56} {'shape':>14} {'exps':>5} {'coverage':>10} {'escapes':>8} {'bits/w':>8}")
        for s in stats:
            shape = "x".join(map(str, s.shape))
            note = "" if s.packed else "  (stays bf16)"
            print(f"{s.name:<56} {shape:>14} {s.distinct_exponents:>5} {s.window_coverage:>10.6f} {s.escapes:>8} "
                  f"{s.bits_per_weight:>8.4f}{note}")
    summary = pack.summarize(stats)
    summary["split12_folder"] = io.is_split12_folder(args.dir)
    print(json.dumps(summary))
    return 0
