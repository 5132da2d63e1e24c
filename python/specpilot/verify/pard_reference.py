"""Reference PARD loop (the "stock" of PARD drafters for tests and `specpilot verify`; no PARD package
exists): HF transformers models (target and PARD drafter, each with its
own DynamicCache), following AMD-AGI/PARD `pard_infer.py`'s parallel mode step by step: the drafter
sees the newly committed tokens then pard_token x (K - 1), drafts are the argmax of its last K rows,
the K - 1 pard entries are cropped from its cache after each draft, the target verifies
[anchor, drafts] and the longest matching prefix plus the target's next token is committed.

Structured as our engine's loop (target prefill gives the first token; the drafter's prompt prefill
is its own forward; verify blocks of min(K + 1, max_length - start); the commit cut after the first
stop token), so tokens and acceptance lengths compare one to one. Greedy only. Nothing of ours is used.
PARD-2 (a warp_model.bin): the input embeddings add target_proj(f) * scale as pard2_infer.py does.
"""
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache


def load_hf(folder, dtype=torch.float32, device="cpu"):
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa").to(device).eval()


class Pard2Warp:
    """PARD-2's input fusion as pard2_infer.py's TargetFeatEmbedWarp: embed(ids) + target_proj(f) * scale,
    f the concatenated target hidden_states[l] (l in pard2_target_layers) of the position before."""

    def __init__(self, drafter_dir, config, dtype, device):
        from pathlib import Path

        warp = torch.load(str(Path(drafter_dir) / "warp_model.bin"), map_location="cpu", weights_only=True)
        self.weight = warp["target_proj.weight"].to(device=device, dtype=dtype)
        self.bias = warp.get("target_proj.bias")
        self.bias = None if self.bias is None else self.bias.to(device=device, dtype=dtype)
        self.scale = float(getattr(config, "pard2_scale", getattr(config, "pard_scale", 0.02)))
        self.layers = [int(i) for i in config.pard2_target_layers]

    def features(self, hidden_states):
        return torch.cat([hidden_states[i] for i in self.layers], dim=-1)

    def embeds(self, drafter, ids, features):
        return drafter.get_input_embeddings()(ids) + F.linear(features, self.weight, self.bias) * self.scale


class PardReference:
    """The PARD drafter for verify/stock.py: an HF causal LM and its pard_token / K (and PARD-2's warp)."""

    def __init__(self, drafter_dir, dtype=torch.float32, device="cpu"):
        self.model = load_hf(drafter_dir, dtype, device)
        config = self.model.config
        self.pard_token = int(config.pard_token)
        self.block_size = int(getattr(config, "pard_draft_k", 12)) + 1
        pard2 = getattr(config, "pard2", False) or getattr(config, "spd_type", None) == "pard2"
        self.warp = Pard2Warp(drafter_dir, config, dtype, device) if pard2 else None

    def generate(self, target, prompt, max_new_tokens, block_size=None, stop_ids=()):
        return pard_generate(target, self.model, prompt, max_new_tokens, block_size or self.block_size,
                             self.pard_token, stop_ids, self.warp)


def _draft_forward(drafter, ids, cache, warp, features):
    if warp is None:
        return drafter(ids, past_key_values=cache, use_cache=True)
    return drafter(inputs_embeds=warp.embeds(drafter, ids, features), past_key_values=cache, use_cache=True)


@torch.inference_mode()
def pard_generate(target, drafter, prompt, max_new_tokens, block_size, pard_token, stop_ids=(), warp=None):
    """-> (new tokens, acceptance lengths). warp: PARD-2's Pard2Warp (None: plain PARD)."""
    n, max_length = len(prompt), len(prompt) + max_new_tokens
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    device = next(target.parameters()).device
    ids = torch.tensor([prompt], device=device)
    out = target(ids, past_key_values=target_cache, use_cache=True, output_hidden_states=warp is not None)
    tokens = [int(out.logits[0, -1].argmax())]
    features = None
    if warp is not None:                     # token i gets the feature of position i - 1 (zeros first)
        feats = warp.features(out.hidden_states)
        features = torch.cat([feats[:, :1] * 0, feats[:, :-1]], dim=1)
        pending_features = feats[:, -1:]
    _draft_forward(drafter, ids, draft_cache, warp, features)                  # the drafter's own prefill
    pending, start, acceptance = [tokens[0]], n, []
    stopped = tokens[0] in stop_ids
    while start + 1 < max_length and not stopped:
        verify = min(block_size, max_length - start)
        block = [tokens[-1]]
        if verify > 1:
            k = verify - 1
            draft_in = torch.tensor([pending + [pard_token] * (k - 1)], device=device)
            features = None if warp is None else torch.cat([pending_features] + [pending_features[:, -1:]] * (k - 1),
                                                           dim=1)
            logits = _draft_forward(drafter, draft_in, draft_cache, warp, features).logits[0, -k:]
            block += logits.argmax(-1).tolist()
            draft_cache.crop(draft_cache.get_seq_length() - (k - 1))        # drop the pard entries
        out = target(torch.tensor([block], device=device), past_key_values=target_cache, use_cache=True,
                     output_hidden_states=warp is not None)
        posterior = out.logits[0].argmax(-1)
        accepted = 0
        while accepted < verify - 1 and block[accepted + 1] == int(posterior[accepted]):
            accepted += 1
        new = (block[1:accepted + 1] + [int(posterior[accepted])])[:max_length - start - 1]
        for i, tok in enumerate(new):
            if tok in stop_ids:
                new, stopped = new[:i + 1], True
                break
        tokens += new
        start += len(new)
        target_cache.crop(start)
        pending = new
        if warp is not None:                 # the verify rows before each new token
            pending_features = warp.features(out.hidden_states)[:, :len(new)]
        acceptance.append(len(new))
    return tokens, acceptance
