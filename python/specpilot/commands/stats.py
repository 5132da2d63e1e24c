"""`specpilot stats DIR`: per-tensor exponent coverage, escapes and bits/weight of a split12 folder,
or of a bf16 folder as it would pack. The last line is one JSON object (bits_per_weight, escapes,
tensors, ...)."""
import json


def configure(parser):
    parser.add_argument("dir", help="a split12 folder or an HF bf16 folder")
    parser.add_argument("--quiet", action="store_true", help="print only the final JSON line")
    parser.add_argument("--cast-bf16", action="store_true",
                        help="measure fp32 / fp16 matrices as their bf16 cast (default: left out, and counted)")


def run(args) -> int:
    from specpilot.formats.split12 import io, pack

    stats, left_out = io.folder_stats(args.dir, cast_bf16=args.cast_bf16)
    if not args.quiet:
        print(f"{'tensor':<56} {'shape':>14} {'exps':>5} {'coverage':>10} {'escapes':>8} {'bits/w':>8}")
        for s in stats:
            shape = "x".join(map(str, s.shape))
            note = "" if s.packed else "  (stays bf16)"
            print(f"{s.name:<56} {shape:>14} {s.distinct_exponents:>5} {s.window_coverage:>10.6f} {s.escapes:>8} "
                  f"{s.bits_per_weight:>8.4f}{note}")
    summary = pack.summarize(stats)
    summary["split12_folder"] = io.is_split12_folder(args.dir)
    summary["left_out_not_bf16"] = len(left_out)
    summary["cast_bf16"] = args.cast_bf16
    if left_out:
        print(f"{len(left_out)} 2-D matrices are not bf16 and were left out (e.g. {left_out[0]}); "
              f"--cast-bf16 measures them as their bf16 cast")
    print(json.dumps(summary))
    return 0
