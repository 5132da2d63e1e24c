"""`specpilot verify`: stock dflash_generate vs our engine on a prompt file. Token forcing of stock's
transcripts through our target, and our speculative output judged against stock's, our AR output's
and the referee's (verify/forcing.py; the rule in verify/verdict.py). The human output ends with
one verdict line ("verdict: PASS ..." or "verdict: FAIL: reasons"), then one JSON line. Exit 0 only
on PASS. A split12 folder runs split12 (stock reads a bf16 unpack of it); --weights split12 packs a
bf16 folder at load."""
import json

from specpilot.engine.cli_support import (add_mechanism_args, add_model_args, apply_run_args, batch_options,
                                          checked_block_size, engine_for, load_pair, mechanism_options, prompts_from_args,
                                          resolve_model_args)

SHOWN_RECORDS = 20      # per list in the human output; the JSON line has every record


def configure(parser):
    add_model_args(parser)
    add_mechanism_args(parser)
    parser.add_argument("--prompts", required=True, help="JSONL file: {id, prompt} or {id, turns} rows")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts")
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    parser.add_argument("--referee", choices=("auto", "none"), default="auto",
                        help="auto: the target at higher precision (fp32 for a bf16 run, fp64 for an fp32 run) "
                             "judges every disagreement; none: the ulp fallback rule instead (said in the output)")
    parser.add_argument("--referee-device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: the GPU when its free memory holds the referee, else the host")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="N > 1: judge the batched engine's output at N requests in flight (each request "
                             "must also equal the single-request engine's output)")


def run(args) -> int:
    from specpilot.models import stop_ids_for
    from specpilot.models.loading import resolve_weights
    from specpilot.verify.forcing import token_force
    from specpilot.verify.referee import load_referee
    from specpilot.verify.stock import load_stock

    apply_run_args(args)
    resolve_model_args(args)
    weights = resolve_weights(args.target, args.dtype, args.weights)
    target, drafter, tok = load_pair(args.target, args.drafter, args.device, args.dtype, weights)
    args.block_size = checked_block_size(args.block_size, drafter)
    prompts = prompts_from_args(args, tok)
    from specpilot.config import EngineConfig

    engine = engine_for(target, drafter, prompts, args.max_new_tokens, EngineConfig(**mechanism_options(args)))
    stock = load_stock(args.target, args.drafter, args.device, args.dtype)
    referee = load_referee(args.target, target.dtype, args.device, args.referee, args.referee_device)
    stop, token_ids, names = stop_ids_for(target, tok), [ids for _, ids in prompts], [pid for pid, _ in prompts]
    from specpilot.verify.batched import batched_runs, judge_batched

    batched = full = mechanisms = None
    if args.concurrency != 1 and args.tree_budget:
        raise ValueError("--tree-budget runs on the single-request engine only (--concurrency 1)")
    if args.concurrency != 1:       # the batched engine's output is "our speculative output" below
        full, mechanisms = batched_runs(engine, token_ids, args.max_new_tokens, args.concurrency, stop, args.block_size,
                                        batch_options(args))
    report = token_force(engine, stock, token_ids, args.max_new_tokens, stop_ids=stop, block_size=args.block_size,
                         ids=names, referee=referee, spec_results=full)
    if full is not None:
        batched = judge_batched(report, engine, token_ids, names, args.max_new_tokens, args.concurrency, full,
                                mechanisms, stop, args.block_size)
        print(f"batched at concurrency {args.concurrency}: identical to the single-request engine on "
              f"{batched['identical_full_verify']}/{batched['prompts']} prompts (full verify), "
              f"{batched['identical_all_mechanisms']}/{batched['prompts']} (all mechanisms)"
              f"{'' if batched['judged'] else ' (bf16: reported, not judged)'}")
    print_report(report)
    print(json.dumps({**report.summary(), "weights": weights, **({"batched": batched} if batched else {})}))
    return 0 if report.passed else 1


def print_report(report) -> None:
    """Per prompt, the referee and its noise, every excused / failed record (up to SHOWN_RECORDS a
    list), the agreement with the referee per path, and the verdict line."""
    from specpilot.verify.target_greedy import runs_stock_pair

    stock_pair = runs_stock_pair(report.reference)
    reference = "stock" if stock_pair else "the target's greedy AR"
    print(f"reference: {report.reference}")
    for row in report.per_prompt:
        bad = row["mismatches"] + row["spec_mismatches"]
        tau = f"stock {row['stock_tau']:.2f} " if stock_pair else ""
        spec = f"identical to {reference}" if row["spec_identical"] else \
            f"forks from {reference} at token {row['spec_fork']}"
        ar = "identical to our AR output" if row["ar_identical"] else \
            f"forks from our AR output at token {row['ar_fork']}"
        print(f"{row['id']}: {row['tokens']} reference tokens, {row['mismatches']} forced mismatches, "
              f"{row['spec_mismatches']} spec mismatches, {row['excused']} excused; our spec output {spec}, {ar}; "
              f"tau {tau}ours {row['our_tau']:.2f}  [{'FAIL' if bad else 'ok'}]")
    print(f"referee: {report.referee} ({report.referee_note})")
    print(f"rule: {report.rule}")
    if report.referee == "none":
        print("  NOTE: no referee scored this run; the ulp fallback rule judged it and the agreement test did not run")
    for side, e in report.referee_error.items():
        print(f"  {side:8s} RMS logit error vs the referee {e['rms_error']:.3g}, same argmax {e['same_argmax']}/"
              f"{e['positions']}")
    for path, a in report.agreement.items():
        print(f"  {path:8s} agrees with the referee at {a['ours_agree']}/{a['positions']} positions, stock at "
              f"{a['stock_agree']} (only stock {a['only_stock']}, only ours {a['only_ours']}, p={a['p']:.2g})"
              f"{'' if a['ok'] else '  FAIL'}")
    for label, items in (("excused", report.excused_list), ("MISMATCH", report.mismatch_list),
                         ("SPEC MISMATCH", report.spec_mismatch_list)):
        for item in items[:SHOWN_RECORDS]:
            print(f"  {label}: {_describe(item)}")
        if len(items) > SHOWN_RECORDS:
            print(f"  ... {len(items) - SHOWN_RECORDS} more {label.lower()} records in the JSON line")
    if report.acceptance_mismatches:
        judged = "judged: fp32 must match stock step for step" if report.acceptance_judged else \
            "not judged: the drafter's own near-ties may differ below fp32, a reduced draft vocabulary " \
            "changes the drafts and tree verification the steps by design"
        print(f"acceptance lengths differ from stock's on {report.acceptance_mismatches} prompts with stock's output "
              f"({judged})")
    print(f"excused positions {report.excused} (cap {report.excuse_cap})")
    print(verdict_line(report))


def verdict_line(report) -> str:
    if report.passed:
        return (f"verdict: PASS: {report.prompts} prompts, {report.tokens} tokens on 3 forced paths and our "
                f"speculative output, {report.excused} excused (cap {report.excuse_cap}), referee {report.referee}")
    return "verdict: FAIL: " + "; ".join(report.reasons)


def _describe(item: dict) -> str:
    where = f"prompt {item['prompt']} token {item['position']} ({item['check']}"
    where += f", {item['path']} path)" if "path" in item else ")"
    versus = {"forced": "stock", "spec-vs-stock": "stock", "spec-vs-ar": "our AR", "spec-transcript": "referee"}
    text = f"{where}: ours {item['ours']} vs {versus[item['check']]} {item['other']}"
    if "note" in item:
        return f"{text}: {item['note']}"
    if item["excused"] and item["margin"] >= item["threshold"]:
        return f"{text}, referee margin {item['margin']:.3g}: ours is the referee's choice"
    local = f", stock's own RMS error here {item['stock_local_error']:.3g}" if "stock_local_error" in item else ""
    return (f"{text}, referee margin {item['margin']:.3g} {'<' if item['excused'] else '>='} {item['threshold']:.3g}"
            f" (referee picks {item['referee_choice']}{local})")
