"""How many key splits one attention cluster should merge: the engine's graphed steps with the
splits merged by the combine kernel (cap "off": the default rule, up to 128 splits) or inside a
thread-block cluster of at most N splits (cap N; the shipped cap is MAX_CLUSTER_SPLITS), alternated
in one process at each context. "default" touches nothing (so it also runs on a tree without the
cluster merge, for an old / new comparison across processes). One-off experiment:

    python bench/probes/cluster_splits.py [--contexts 512,2048] [--caps off,16,14,12,8] [--reps 2]

Prints one markdown table last.
"""
import argparse
import contextlib

from verify_splits import sweep

from specpilot.kernels import decode_attention


@contextlib.contextmanager
def split_policy(cap: str):
    if cap == "default":
        yield
        return
    shipped = decode_attention.MAX_CLUSTER_SPLITS
    previous = decode_attention.set_cluster_merge(cap != "off")
    if cap != "off":
        decode_attention.MAX_CLUSTER_SPLITS = int(cap)   # split_cap() reads it when a step is traced
    try:
        yield
    finally:
        decode_attention.MAX_CLUSTER_SPLITS = shipped
        decode_attention.set_cluster_merge(previous)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", default="512,2048")
    p.add_argument("--caps", default="off,16,14,12,8")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--label", default="", help="a name for this tree in the table")
    args = p.parse_args()

    rows = sweep(split_policy, args.caps.split(","), list(map(int, args.contexts.split(","))), args.reps, args.iters,
                 "cap")
    print("\nqwen3-8b, random weights, bf16, config 8; attention splits merged by the combine kernel (off) or in "
          "a cluster of at most N splits")
    print("| tree | context | cap | AR ms | verify16 ms | draft ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {args.label} | {r['context']} | {r['cap']} | {r['ar_ms']:.3f} | {r['verify_ms']:.3f} | "
              f"{r['draft_ms']:.3f} |")


if __name__ == "__main__":
    main()
