"""How many key splits the multi-row attention (verify / draft blocks) should use: the engine's
graphed steps with the split count of calls over more than 16 query rows per KV head forced to each
value (one-token steps keep the default: their AR column is the drift control), alternated in one
process at each context. With --one-token the one-token calls (the AR step) are forced instead, and
the verify / draft columns are the drift control. One-off experiment, not part of the package:

    python bench/probes/verify_splits.py [--contexts 512,2048] [--splits 0,12,8,4] [--reps 2] [--one-token]

0 = the default rule (kernels/decode_attention.default_splits). Prints one markdown table.
"""
import argparse
import contextlib
import json


from specpilot.kernels import decode_attention


ONE_TOKEN = False   # --one-token: force the calls of <= 16 rows per KV head instead


@contextlib.contextmanager
def forced_splits(n):
    real = decode_attention.default_splits
    if n > 0:
        decode_attention.default_splits = lambda b, hkv, rows, span, sms, cap: (
            n if (rows <= 16) == ONE_TOKEN else real(b, hkv, rows, span, sms, cap))
    try:
        yield
    finally:
        decode_attention.default_splits = real


def sweep(policy, settings, contexts, reps: int, iters: int, key: str) -> list:
    """The Qwen3-8B engine's graphed step times (config 8) under `policy(setting)` (a context
    manager) for each setting, alternated within each rep, at each context: one row per run, with
    the setting under `key`. Shared by the split probes."""
    from specpilot.bench.gpu_engine import fresh_engine_steps, scale_pair, use_best_kernels

    target, drafter = scale_pair("qwen3-8b")
    use_best_kernels()
    rows = []
    for context in contexts:
        for _ in range(reps):
            for setting in settings:
                with policy(setting):
                    steps = fresh_engine_steps(target, drafter, iters, context=context)
                rows.append({"context": context, key: setting, **{k: steps[k] for k in ("ar_ms", "verify_ms", "draft_ms")}})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", default="512,2048")
    p.add_argument("--splits", default="0,12,8,4")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--one-token", action="store_true", help="force the one-token calls' splits instead")
    args = p.parse_args()
    global ONE_TOKEN
    ONE_TOKEN = args.one_token

    rows = sweep(forced_splits, list(map(int, args.splits.split(","))), list(map(int, args.contexts.split(","))),
                 args.reps, args.iters, "splits")
    calls = "one-token" if ONE_TOKEN else "multi-row"
    print(f"\nqwen3-8b, random weights, bf16, config 8; splits of the {calls} attention calls (0 = default)")
    print("| context | splits | AR ms | verify16 ms | draft ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['context']} | {r['splits']} | {r['ar_ms']:.3f} | {r['verify_ms']:.3f} | {r['draft_ms']:.3f} |")


if __name__ == "__main__":
    main()
