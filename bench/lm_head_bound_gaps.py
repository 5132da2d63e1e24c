"""Why the certified LM head's bounds certify nothing on a trained head: the LM head's spectrum and, on
the final hidden states of real prompts, how far each bound's largest row bound sits above the best
logit, against the gap between the best and second logits (what a certificate must resolve).

  python -m specpilot.bench.lm_head_bound_gaps --target T --prompts A.jsonl --limit 4 \\
      --ranks 0,64,256,480 --clusters 256,1024

Bounds (engine/certified_head.py): rank r, w.h <= (P w).(P h) + ||w - P^T P w|| ||h - P^T P h|| (r = 0:
Cauchy-Schwarz); clusters K (k-means, 15 Lloyd steps), w.h <= c_k.h + radius_k ||h||. fp64 throughout.
"""
from __future__ import annotations

import argparse
import json

import torch


def final_hiddens(target, prompts) -> torch.Tensor:
    """The LM head's input rows [T, H] over every prompt position (one prefill each)."""
    from specpilot.engine.cache import target_cache

    rows = []
    hook = target.lm_head.register_forward_hook(lambda m, i, o: rows.append(i[0][0].detach().double()))
    for ids in prompts:
        cache = target_cache(target, 1, len(ids) + 1)
        t = torch.tensor([ids])
        target.ensure_rope(len(ids) + 1)
        target(t, torch.arange(len(ids)), cache, len(ids))
    hook.remove()
    return torch.cat(rows)


def kmeans_bound(w, x, k: int, seed: int = 0) -> torch.Tensor:
    """[T]: the largest cluster bound per row."""
    cent = w[torch.randperm(w.shape[0], generator=torch.Generator().manual_seed(seed))[:k]].clone()
    for _ in range(15):
        assign = torch.cdist(w, cent).argmin(1)
        cent = torch.zeros_like(cent).index_add_(0, assign, w) / torch.bincount(assign, minlength=k).clamp(min=1)[:, None]
    assign = torch.cdist(w, cent).argmin(1)
    radius = torch.zeros(k, dtype=w.dtype).scatter_reduce(0, assign, (w - cent[assign]).norm(dim=1), "amax")
    return (x @ cent.T + radius[None] * x.norm(dim=1, keepdim=True)).max(1).values


def main(argv=None) -> int:
    from specpilot.engine.certified_head import HeadBounds
    from specpilot.models import load_target, load_tokenizer
    from specpilot.models.draft_vocab import head_weight
    from specpilot.models.prompts import encode_prompt, read_prompts

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--prompts", required=True, action="append")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--ranks", default="0,64,256,480")
    p.add_argument("--clusters", default="256,1024")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    target = load_target(args.target, dtype=torch.float32)
    tok = load_tokenizer(args.target)
    prompts = [encode_prompt(tok, r)[-256:] for path in args.prompts for r in read_prompts(path, args.limit)]
    with torch.inference_mode():
        x = final_hiddens(target, prompts)
    w = head_weight(target.lm_head).detach().double()
    logits = x @ w.T
    top2 = logits.topk(2, dim=1).values
    s = torch.linalg.svdvals(w)
    out = {"rows": x.shape[0], "hidden": w.shape[1], "vocab": w.shape[0],
           "energy_top_r": {r: float((s[:r] ** 2).sum() / (s ** 2).sum()) for r in (32, 64, 128, 256, 384) if r < len(s)},
           "median_best_minus_second": float((top2[:, 0] - top2[:, 1]).median()),
           "median_hidden_norm": float(x.norm(dim=1).median()), "gap_over_best": {}}
    for r in (int(v) for v in args.ranks.split(",")):
        ub = HeadBounds.build(target.lm_head.weight, r).upper_bounds(x).max(1).values
        out["gap_over_best"][f"rank {r}"] = float((ub - top2[:, 0]).median())
    for k in (int(v) for v in args.clusters.split(",")):
        out["gap_over_best"][f"clusters {k}"] = float((kmeans_bound(w, x, k) - top2[:, 0]).median())
    print(f"{out['rows']} rows; best - second logit, median {out['median_best_minus_second']:.2f}; "
          f"energy of the top-r singular directions {', '.join(f'{r}: {e:.2f}' for r, e in out['energy_top_r'].items())}")
    print("| bound | median over rows: largest row bound - best logit |")
    print("| --- | --- |")
    for name, gap in out["gap_over_best"].items():
        print(f"| {name} | {gap:.2f} |")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
