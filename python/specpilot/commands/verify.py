"""`specpilot verify`: stock dflash_generate vs our engine on a prompt file; token forcing of
stock's transcripts through our target. Exit 0 only if every prompt passes; the last line is one
JSON object (prompts, tokens, mismatches, tolerated, passed, weights, ...). A split12 folder runs
split12 (stock reads a bf16 unpack of it); --weights split12 packs a bf16 folder at load."""
import json

from specpilot.engine.cli_support import add_model_args, engine_for, load_pair, prompts_from_args


def configure(parser):
    add_model_args(parser)
    parser.add_argument("--prompts", required=True, help="JSONL file: {id, prompt} or {id, turns} rows")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts")
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    parser.add_argument("--arbiter", choices=("none", "fp32"), default="none",
                        help="fp32: also load the target in fp32; report which side it takes at each "
                             "disagreement, and stock's and each of our paths' logit error against it at "
                             "every position (diagnostic; the verdict is unchanged)")
    parser.add_argument("--arbiter-device", default=None,
                        help="where the fp32 arbiter runs (default: --device); cpu keeps its fp32 copy of the "
                             "target (4 bytes a weight) out of GPU memory")


def run(args) -> int:
    from specpilot.models import stop_ids_for
    from specpilot.models.loading import resolve_weights
    from specpilot.verify.forcing import token_force
    from specpilot.verify.stock import load_stock

    weights = resolve_weights(args.target, args.dtype, args.weights)
    target, drafter, tok = load_pair(args.target, args.drafter, args.device, args.dtype, weights)
    prompts = prompts_from_args(args, tok)
    engine = engine_for(target, drafter, prompts, args.max_new_tokens)
    stock = load_stock(args.target, args.drafter, args.device, args.dtype)
    arbiter = None
    if args.arbiter == "fp32":
        from specpilot.models import load_target
        arbiter = load_target(args.target, device=args.arbiter_device or args.device, dtype="fp32")
    report = token_force(engine, stock, [ids for _, ids in prompts], args.max_new_tokens,
                         stop_ids=stop_ids_for(target, tok), block_size=args.block_size,
                         ids=[pid for pid, _ in prompts], arbiter=arbiter)
    print_report(report)
    print(json.dumps({**report.summary(), "weights": weights}))
    return 0 if report.passed else 1


def print_report(report):
    for row in report.per_prompt:
        verdict = "ok" if row["mismatches"] == 0 else "FAIL"
        print(f"{row['id']}: {row['tokens']} stock tokens, {row['mismatches']} mismatches, {row['tolerated']} "
              f"tolerated; our spec output identical to stock for {row['spec_identical_prefix']}/"
              f"{row['tokens']} tokens; tau stock {row['stock_tau']:.2f} ours {row['our_tau']:.2f}  [{verdict}]")
    for item in report.tolerated_list:
        print(f"  tolerated near-tie: prompt {item['prompt']} token {item['position']} ({item['path']} path): "
              f"ours {item['ours']} "
              f"stock {item['stock']}, stock margin {item['margin']:.3g} < eps {item['eps']:.3g}{_arbiter_note(item)}")
    for item in report.mismatch_list:
        print(f"  MISMATCH: prompt {item['prompt']} token {item['position']} ({item['path']} path): "
              f"ours {item['ours']} "
              f"stock {item['stock']}, stock margin {item['margin']:.3g} >= eps {item['eps']:.3g}{_arbiter_note(item)}")
    if report.arbiter:
        print(f"{report.arbiter} arbiter over {len(report.tolerated_list) + len(report.mismatch_list)} disagreements: "
              f"sides with ours {report.arbiter_sides_with_ours}, with stock {report.arbiter_sides_with_stock}")
        print(f"{report.arbiter} arbiter at every generated position (logit RMS error against it; argmax the same as its):")
        for side, e in report.arbiter_error.items():
            print(f"  {side:8s} RMS error {e['rms_error']:.4g}, same argmax {e['same_argmax']}/{e['positions']}")
        print(_error_reading(report.arbiter_error))


def _error_reading(error: dict) -> str:
    """One line: is our worst path about as far from the arbiter as stock is (rounded differently),
    or further (a precision loss to look for)? The verdict does not depend on it."""
    stock = error.get("stock", {}).get("rms_error")
    ours = {side: e["rms_error"] for side, e in error.items() if side != "stock"}
    if not stock or not ours:
        return "  (nothing to compare)"
    side = max(ours, key=ours.get)
    ratio = ours[side] / stock
    if ratio <= 1.05:
        return (f"  our paths are as close to the arbiter as stock (worst: {side}, {ratio:.3f}x stock's error): "
                "disagreements come from rounding, not lost precision")
    return f"  our {side} path is {ratio:.2f}x stock's error against the arbiter: look for lost precision there"


def _arbiter_note(item) -> str:
    if "arbiter_choice" not in item:
        return ""
    side = "ours" if item["arbiter_choice"] == item["ours"] else "stock" if item["arbiter_choice"] == item["stock"] \
        else f"neither ({item['arbiter_choice']})"
    return f"; arbiter picks {side}, logit(ours)-logit(stock) {item['arbiter_ours_minus_stock']:+.3g}"
