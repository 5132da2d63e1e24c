"""Reference PARD loop (the "stock" of PARD drafters for tests and `specpilot verify`; no PARD package
exists): HF transformers models (target and PARD drafter, each with its
own DynamicCache), following AMD-AGI/PARD `pard_infer.py`'s parallel mode step by step: the drafter
sees the newly committed tokens then pard_token x (K - 1), drafts are the argmax of its last K rows,
the K - 1 pard entries are cropped from its cache after each draft, the target verifies
[anchor, drafts] and the longest matching prefix plus the target's next token is committed.

Structured as our engine's loop (target prefill gives the first token; the drafter's prompt prefill
is its own forward; verify blocks of min(K + 1, max_length - start); the commit cut after the first
stop token), so tokens and acceptance lengths compare one to one. Greedy only. Nothing of ours is used.
"""
import torch
from transformers import AutoModelForCausalLM, DynamicCache


def load_hf(folder, dtype=torch.float32, device="cpu"):
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa").to(device).eval()


class PardReference:
    """The PARD drafter for verify/stock.py: an HF causal LM and its pard_token / K."""

    def __init__(self, drafter_dir, dtype=torch.float32, device="cpu"):
        self.model = load_hf(drafter_dir, dtype, device)
        self.pard_token = int(self.model.config.pard_token)
        self.block_size = int(getattr(self.model.config, "pard_draft_k", 12)) + 1

    def generate(self, target, prompt, max_new_tokens, block_size=None, stop_ids=()):
        return pard_generate(target, self.model, prompt, max_new_tokens, block_size or self.block_size,
                             self.pard_token, stop_ids)


@torch.inference_mode()
def pard_generate(target, drafter, prompt, max_new_tokens, block_size, pard_token, stop_ids=()):
    """-> (new tokens, acceptance lengths)."""
    n, max_length = len(prompt), len(prompt) + max_new_tokens
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    device = next(target.parameters()).device
    ids = torch.tensor([prompt], device=device)
    tokens = [int(target(ids, past_key_values=target_cache, use_cache=True).logits[0, -1].argmax())]
    drafter(ids, past_key_values=draft_cache, use_cache=True)                 # the drafter's own prefill
    pending, start, acceptance = [tokens[0]], n, []
    stopped = tokens[0] in stop_ids
    while start + 1 < max_length and not stopped:
        verify = min(block_size, max_length - start)
        block = [tokens[-1]]
        if verify > 1:
            k = verify - 1
            draft_in = torch.tensor([pending + [pard_token] * (k - 1)], device=device)
            logits = drafter(draft_in, past_key_values=draft_cache, use_cache=True).logits[0, -k:]
            block += logits.argmax(-1).tolist()
            draft_cache.crop(draft_cache.get_seq_length() - (k - 1))        # drop the pard entries
        out = target(torch.tensor([block], device=device), past_key_values=target_cache, use_cache=True)
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
        acceptance.append(len(new))
    return tokens, acceptance
