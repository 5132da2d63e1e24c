"""The zoo recipe's train_target.py, with the new model's (tied) embedding initialised from the zoo
target's: its top principal directions (SVD of the 8192 x 512 matrix, cut to --hidden columns).
A CPU trains the small embedded target for minutes only; a good start for half its parameters (the
embedding) is most of what those minutes can buy. Everything else is train_target.py as it is.

  python train_target_pca.py --zoo-target shared/zoo/code-tiny [--init TARGET_DIR] <train_target.py arguments>

--init continues an earlier target of the same shape (its weights, not the principal directions).
"""
import argparse
import os
import sys

import torch

ZOO_RECIPE = os.environ.get("SPECPILOT_ZOO_RECIPE", os.path.join(os.path.dirname(__file__), "../../../shared/zoo/recipe"))
sys.path.insert(0, os.path.abspath(ZOO_RECIPE))
import train_target  # noqa: E402  (the zoo recipe)


def pca_embedding(zoo_target: str, hidden: int) -> torch.Tensor:
    from safetensors.torch import load_file

    weights = load_file(os.path.join(zoo_target, "model.safetensors"))
    emb = weights["model.embed_tokens.weight"].float()                 # [V, 512]
    u, s, _ = torch.linalg.svd(emb - emb.mean(0), full_matrices=False)
    low = u[:, :hidden] * s[:hidden] + 0.0                              # [V, hidden]
    return low * (emb.std() / low.std())                                # the zoo embedding's scale


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--zoo-target", required=True)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--init", help="a target folder of the same shape to continue training from")
    known, rest = ap.parse_known_args()
    init = None if known.init else pca_embedding(known.zoo_target, known.hidden)
    base = train_target.Qwen3ForCausalLM

    class FromZooEmbedding(base):
        def __init__(self, config):
            super().__init__(config)
            with torch.no_grad():
                if known.init:
                    from safetensors.torch import load_file

                    missing, unexpected = self.load_state_dict(load_file(os.path.join(known.init, "model.safetensors")),
                                                               strict=False)
                    if unexpected or set(missing) - {"lm_head.weight"}:        # the head is tied to the embedding
                        raise SystemExit(f"--init {known.init}: not this shape (missing {missing}, unexpected {unexpected})")
                    print(f"[target] weights from {known.init}", flush=True)
                else:
                    self.model.embed_tokens.weight.copy_(init)
                    print(f"[target] embedding initialised from {known.zoo_target} (top {known.hidden} principal "
                          f"directions)", flush=True)

    FromZooEmbedding.__name__ = FromZooEmbedding.__qualname__ = base.__name__   # config.json's architectures
    train_target.Qwen3ForCausalLM = FromZooEmbedding
    sys.argv = [sys.argv[0], "--hidden", str(known.hidden)] + rest
    train_target.main()


if __name__ == "__main__":
    main()
