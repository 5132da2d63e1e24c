"""Train a PARD drafter for the zoo target (shared/zoo/code-tiny) on the zoo corpus.

PARD (AMD-AGI/PARD) drafts K tokens in one causal forward of [context, pard x (K - 1)]: the last
context row predicts x_{t+1}, the i-th pard row x_{t+1+i}. Training teaches exactly that. Each
window of L corpus tokens is followed by A pard blocks, one per sampled anchor t, of K - 1 pard
tokens at positions t+1 .. t+K-1. One attention mask makes it one forward:
  - corpus rows are causal among themselves and never see a pard row;
  - the pard rows of anchor t see corpus rows <= t and the rows of their own block up to themselves.
So every pard row computes what inference computes, and a single pass trains the AR loss (every
corpus row) and A x (K - 1) parallel-draft losses. The drafter is a Qwen3ForCausalLM with the
target's shape at --layers layers, initialised from the target's embedding, its first --layers
decoder layers and its final norm (PARD starts from a small pretrained LM of the same family). It
is saved with `pard_token` (the tokenizer's <|mask|>, 8191) and `pard_draft_k` = K in config.json,
so `specpilot generate/verify/bench --drafter OUT` detect it as a PARD drafter.

The data is build_corpus.py's output (tokens.bin as uint16, meta.json):
    python shared/zoo/recipe/build_corpus.py corpus --out /tmp/zoo/data          # about 30 s
    python scripts/train_pard.py --data /tmp/zoo/data --target shared/zoo/code-tiny \
        --out /tmp/zoo/code-tiny-pard-k8 --seconds 300

Cost: the drafter (2 layers, 512 wide) is about a quarter of the target's compute per token, and
each window carries L + A (K - 1) rows (512 + 32 x 7 = 736 by default). The target trained at
1.58 M tokens/s on one H200, so expect about 3 M rows/s here: 300 s gives about 0.9 G rows, more
than the target's own 756 M training tokens. That is 5 minutes of H200 plus about 1 minute for
loading and the corpus. Not run yet: no GPU was used while writing it. tests/test_train_pard.py
checks on the CPU that the masked pass equals separate [context, pards] forwards.
"""
import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def pard_batch(windows, anchors, k: int, pard_token: int):
    """windows [B, L + K] int64 corpus tokens; anchors: sorted list of positions t (0 <= t < L).
    -> (ids [B, T], positions [T], mask [T, T] bool (True = visible), labels [B, T]) with
    T = L + len(anchors) * (k - 1)."""
    b, total = windows.shape
    length = total - k
    n_pard = len(anchors) * (k - 1)
    t = length + n_pard
    device = windows.device
    ids = torch.cat([windows[:, :length], torch.full((b, n_pard), pard_token, dtype=windows.dtype,
                                                      device=device)], dim=1)
    positions = torch.cat([torch.arange(length, device=device)] +
                          [torch.arange(a + 1, a + k, device=device) for a in anchors])
    labels = torch.cat([windows[:, 1:length + 1]] +
                       [windows[:, a + 2:a + k + 1] for a in anchors], dim=1)
    mask = torch.zeros(t, t, dtype=torch.bool, device=device)
    mask[:length, :length] = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    for j, a in enumerate(anchors):
        rows = slice(length + j * (k - 1), length + (j + 1) * (k - 1))
        mask[rows, :a + 1] = True                                             # the context
        mask[rows, rows] = torch.ones(k - 1, k - 1, dtype=torch.bool, device=device).tril()
    return ids, positions, mask, labels


def drafter_from_target(target_dir, layers: int, k: int, pard_token: int, device):
    from transformers import AutoModelForCausalLM, Qwen3Config

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    cfg = target.config.to_dict()
    cfg.update(num_hidden_layers=layers, layer_types=["full_attention"] * layers, pard_token=pard_token,
               pard_draft_k=k, architectures=["Qwen3ForCausalLM"])
    for key in ("transformers_version", "model_type", "dtype", "torch_dtype"):
        cfg.pop(key, None)
    config = Qwen3Config(**cfg)
    from transformers import Qwen3ForCausalLM

    drafter = Qwen3ForCausalLM(config)
    own = drafter.state_dict()
    copied = {name: t for name, t in target.state_dict().items() if name in own and own[name].shape == t.shape}
    drafter.load_state_dict(copied, strict=False)    # embedding, first `layers` layers, final norm (tied head)
    return drafter.to(device), len(copied)


def masked_loss(model, ids, positions, mask, labels):
    additive = torch.zeros(mask.shape, dtype=torch.float32, device=ids.device).masked_fill_(~mask, float("-inf"))
    logits = model(input_ids=ids, position_ids=positions[None].expand(ids.shape[0], -1),
                   attention_mask=additive[None, None].to(next(model.parameters()).dtype)).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="build_corpus.py output: tokens.bin, meta.json")
    ap.add_argument("--target", required=True, help="the zoo target folder (init, tokenizer, shape)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--k", type=int, default=8, help="drafts per step (engine block K + 1)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    meta = json.loads((Path(a.data) / "meta.json").read_text())
    tokens = np.fromfile(Path(a.data) / "tokens.bin", dtype=np.uint16)
    train = torch.from_numpy(tokens[:-meta["val_tokens"]].astype(np.int64)).to(a.device)
    pard_token = int(meta.get("mask_id", meta["vocab_size"] - 1))
    model, copied = drafter_from_target(a.target, a.layers, a.k, pard_token, a.device)
    print(f"drafter {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, {copied} tensors from the target")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator(device="cpu").manual_seed(0)
    start, step = time.time(), 0
    while time.time() - start < a.seconds:
        frac = (time.time() - start) / a.seconds
        for group in opt.param_groups:                       # 3 % warmup, cosine to 5 %
            group["lr"] = a.lr * min(frac / 0.03, 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        offsets = torch.randint(0, train.numel() - a.seq - a.k, (a.batch,), generator=gen).to(a.device)
        windows = train[offsets[:, None] + torch.arange(a.seq + a.k, device=a.device)]
        anchors = sorted(torch.randperm(a.seq, generator=gen)[:a.anchors].tolist())
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.device == "cuda"):
            loss = masked_loss(model, *pard_batch(windows, anchors, a.k, pard_token))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f} {time.time() - start:.0f}s", flush=True)
    out = Path(a.out)
    model.to(torch.bfloat16).save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (Path(a.target) / name).exists():
            shutil.copy(Path(a.target) / name, out / name)
    print(f"saved {out} after {step} steps")


if __name__ == "__main__":
    main()
