"""Which attention calls should merge their key splits inside a thread-block cluster, and how many
splits one cluster should take: the engine's graphed steps under each setting, alternated in one
process at each context. A setting is a set_cluster_merge mode ("none": the combine kernel, up to
128 splits; "all"; "multi_token": the verify / draft blocks only), optionally with a cap on a
cluster's splits ("all:12"; default MAX_CLUSTER_SPLITS). "default" touches nothing (so it also runs
on an older tree, for an old / new comparison across processes). One-off experiment:

    python bench/probes/cluster_splits.py [--contexts 512,2048] [--settings none,all,multi_token] [--reps 2]

Prints one markdown table last.
"""
import argparse
import contextlib

from verify_splits import sweep

from specpilot.kernels import decode_attention


@contextlib.contextmanager
def cluster_policy(setting: str):
    if setting == "default":
        yield
        return
    mode, _, cap = setting.partition(":")
    shipped = decode_attention.MAX_CLUSTER_SPLITS
    previous = decode_attention.set_cluster_merge(mode)
    if cap:
        decode_attention.MAX_CLUSTER_SPLITS = int(cap)   # split_cap() reads it when a step is traced
    try:
        yield
    finally:
        decode_attention.MAX_CLUSTER_SPLITS = shipped
        decode_attention.set_cluster_merge(previous)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", default="512,2048")
    p.add_argument("--settings", default="none,all,multi_token")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--label", default="", help="a name for this tree in the table")
    args = p.parse_args()

    rows = sweep(cluster_policy, args.settings.split(","), list(map(int, args.contexts.split(","))), args.reps,
                 args.iters, "setting")
    print("\nqwen3-8b, random weights, bf16, config 8; attention splits merged by the combine kernel (none) or in "
          "a cluster (all calls / multi_token calls; :N caps a cluster's splits)")
    print("| tree | context | setting | AR ms | verify16 ms | draft ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {args.label} | {r['context']} | {r['setting']} | {r['ar_ms']:.3f} | {r['verify_ms']:.3f} | "
              f"{r['draft_ms']:.3f} |")


if __name__ == "__main__":
    main()
