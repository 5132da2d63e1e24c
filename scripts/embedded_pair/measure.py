"""Acceptance of a target + DFlash drafter pair on held-out prompts, with our engine (fp32 on the CPU:
exact, and lossless-checked against stock by `specpilot verify`): per prompt the greedy speculative
output, its acceptance lengths (tau, bonus token included, as dflash counts), and whether it equals the
target-only output. Prompts are cut to their last --prompt-tokens tokens, as `specpilot demo` does.

  python measure.py --target T --drafter D --prompts held_out.jsonl --out measure.json
"""
import argparse
import dataclasses
import json
import time

import torch

from specpilot import Engine, EngineConfig, load_pair
from specpilot.models import stop_ids_for
from specpilot.models.prompts import encode_prompt, read_prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=160)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--strip-final-newline", action="store_true", help="prompts without their final newline")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, drafter, tok = load_pair(a.target, a.drafter, device="cpu", dtype="fp32")
    prompts = read_prompts(a.prompts, a.limit)
    if a.strip_final_newline:        # as the demo's prompts (assemble.py): see the zoo README's limitation
        prompts = [dataclasses.replace(p, text=p.text.rstrip("\n")) for p in prompts]
    rows = [(p.id, encode_prompt(tok, p)[-a.prompt_tokens:]) for p in prompts]
    engine = Engine(target, drafter, max_seq_len=a.prompt_tokens + a.max_new_tokens + 64, config=EngineConfig())
    stop = stop_ids_for(target, tok)
    per_prompt, t0 = [], time.time()
    for pid, ids in rows:
        spec = engine.generate_spec(ids, a.max_new_tokens, stop)
        ar = engine.generate_ar(ids, a.max_new_tokens, stop)
        per_prompt.append({"id": pid, "tokens": len(spec.tokens), "acceptance_lengths": spec.acceptance_lengths,
                           "tau": spec.tau, "identical_to_ar": spec.tokens == ar.tokens,
                           "spec_tokens_per_s": spec.tokens_per_s, "ar_tokens_per_s": ar.tokens_per_s,
                           "completion": tok.decode(spec.tokens, skip_special_tokens=True)})
        print(f"{pid}: {len(spec.tokens)} tokens, tau {spec.tau:.2f}", flush=True)
    stepped = [r for r in per_prompt if r["acceptance_lengths"]]
    steps = [x for r in stepped for x in r["acceptance_lengths"]]
    hist = [round(100 * steps.count(k) / len(steps), 1) for k in range(1, drafter.block_size + 1)] if steps else []
    summary = {
        "prompts": len(per_prompt), "prompts_with_steps": len(stepped),
        "tau": round(sum(r["tau"] for r in stepped) / max(1, len(stepped)), 3),       # dflash's mean of means
        "tau_token_weighted": round(sum(steps) / max(1, len(steps)), 3),
        "acceptance_histogram_percent": hist,
        "identical_to_ar": sum(r["identical_to_ar"] for r in per_prompt),
        "spec_tokens_per_s_cpu": round(sum(r["spec_tokens_per_s"] for r in stepped) / max(1, len(stepped)), 1),
        "ar_tokens_per_s_cpu": round(sum(r["ar_tokens_per_s"] for r in stepped) / max(1, len(stepped)), 1),
        "max_new_tokens": a.max_new_tokens, "prompt_tokens": a.prompt_tokens, "prompts_file": a.prompts,
        "final_newline_stripped": a.strip_final_newline,
        "seconds": round(time.time() - t0, 1), "device": "cpu", "dtype": "fp32", "torch": torch.__version__,
    }
    json.dump({"summary": summary, "per_prompt": per_prompt}, open(a.out, "w"), indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
