"""Reference DSpark loop (the "stock" of DSpark drafters for tests and `specpilot verify`; DeepSpec is
not a package): plain torch over the checkpoint's tensors (published names)
and an HF transformers target, following deepseek-ai/DeepSpec's evaluator
(`deepspec/eval/dspark/evaluator.py`, `base_evaluator.generate_decoding_sample`) step by step:

  prefill the target (hidden states of target_layer_ids), first token = argmax
  per step: draft input [anchor, mask x (K - 1)] at positions start..; context = the target hidden
    states not yet in the draft cache (hidden_norm(fc(.)) -> each layer's k/v, k-norm, RoPE),
    appended to a per-layer K/V list; non-causal attention of the block over [cache, block];
    the cache is cropped back to `start` (the block's own K/V dropped); every block row drafts:
    logits_k = lm_head(h_k) + W2(W1[x_{k-1}]), x_0 = anchor, x_k = argmax
  verify [anchor, drafts] with the target, accept the longest matching prefix and the target's
    next token; the context for the next step is the verified hidden states of the committed rows.

One deviation from the evaluator, shared with our engine: the verify block is
min(K + 1, max_length - start) and a shorter block drafts that many rows (the evaluator drafts K
past max_length and trims), so that the one commit rule (engine/accept.py) holds; the outputs are
the same, the last step's acceptance length may differ. Greedy only.
"""
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.qwen3.modeling_qwen3 import Qwen3Config, Qwen3RotaryEmbedding


def rms_norm(x, weight, eps):
    var = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(var + eps)).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DSparkReference:
    def __init__(self, drafter_dir, dtype=torch.float32, device="cpu"):
        from specpilot.models.checkpoint import read_state_dict

        self.cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in read_state_dict(drafter_dir).items()}
        self.device = torch.device(device)
        self.block_size = int(self.cfg.get("block_size", 7)) + 1
        c = self.cfg
        self.heads, self.kv_heads, self.d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.eps, self.layers = c["rms_norm_eps"], c["num_hidden_layers"]
        self.rotary = Qwen3RotaryEmbedding(Qwen3Config(**{k: v for k, v in c.items() if k != "architectures"}))

    def rope(self, positions):
        """(cos, sin) [T, D] as the published Qwen3DSparkModel's rotary embedding computes them."""
        dtype = self.w["fc.weight"].dtype
        cos, sin = self.rotary(torch.zeros(1, dtype=dtype), positions[None].cpu())
        return cos[0].to(self.device), sin[0].to(self.device)

    def features(self, hidden_states):
        return torch.cat([hidden_states[i + 1] for i in self.cfg["target_layer_ids"]], dim=-1)

    def draft_block(self, block, context, start, cache):
        """block [K] token ids, context [C, F] at positions start - C.., cache: per layer [k, v]."""
        w, eps = self.w, self.eps
        ctx = rms_norm(context @ w["fc.weight"].T, w["hidden_norm.weight"], eps)        # [C, H]
        x = w["embed_tokens.weight"][block]                                            # [K, H]
        k_len, c_len = x.shape[0], ctx.shape[0]
        cos, sin = self.rope(torch.arange(start - c_len, start + k_len, device=self.device))
        for i in range(self.layers):
            p = f"layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(k_len, self.heads, self.d)
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps).transpose(0, 1)
            both = torch.cat([ctx, h])
            k = (both @ w[p + "self_attn.k_proj.weight"].T).view(-1, self.kv_heads, self.d)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps).transpose(0, 1)
            v = (both @ w[p + "self_attn.v_proj.weight"].T).view(-1, self.kv_heads, self.d).transpose(0, 1)
            q = q * cos[-k_len:] + rotate_half(q) * sin[-k_len:]
            k = k * cos + rotate_half(k) * sin
            cache[i][0] = torch.cat([cache[i][0], k], dim=1)
            cache[i][1] = torch.cat([cache[i][1], v], dim=1)
            group = self.heads // self.kv_heads
            keys, values = cache[i][0].repeat_interleave(group, 0), cache[i][1].repeat_interleave(group, 0)
            out = F.scaled_dot_product_attention(q, keys, values, scale=self.d ** -0.5)   # non-causal
            x = x + out.transpose(0, 1).reshape(k_len, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        for i in range(self.layers):                                                   # crop to start
            cache[i][0], cache[i][1] = cache[i][0][:, :start], cache[i][1][:, :start]
        return rms_norm(x, w["norm.weight"], eps)                                      # [K, H]

    def markov_drafts(self, hidden, anchor):
        w, prev, drafts = self.w, anchor, []
        base = hidden @ w["lm_head.weight"].T
        for k in range(hidden.shape[0]):
            logits = base[k] + w["markov_head.markov_w2.weight"] @ w["markov_head.markov_w1.weight"][prev]
            prev = int(logits.argmax())
            drafts.append(prev)
        return drafts

    @torch.inference_mode()
    def generate(self, target, prompt, max_new_tokens, block_size=None, stop_ids=()):
        """target: the HF causal LM; block_size: the verify block (anchor + drafts), default the
        checkpoint's block_size + 1. -> (new tokens, acceptance lengths)."""
        block_size = block_size or self.block_size
        n, max_length = len(prompt), len(prompt) + max_new_tokens
        target_cache, dev = DynamicCache(), self.device
        out = target(torch.tensor([prompt], device=dev), past_key_values=target_cache, use_cache=True,
                     output_hidden_states=True)
        tokens = [int(out.logits[0, -1].argmax())]
        context = self.features(out.hidden_states)[0]
        empty = torch.zeros(self.kv_heads, 0, self.d, device=dev, dtype=context.dtype)
        cache = [[empty, empty] for _ in range(self.layers)]
        start, acceptance, stopped = n, [], tokens[0] in stop_ids
        mask = self.cfg["mask_token_id"]
        while start + 1 < max_length and not stopped:
            verify = min(block_size, max_length - start)
            block = [tokens[-1]]
            if verify > 1:
                hidden = self.draft_block(torch.tensor([tokens[-1]] + [mask] * (verify - 2), device=dev), context,
                                          start, cache)
                block += self.markov_drafts(hidden, tokens[-1])
            out = target(torch.tensor([block], device=dev), past_key_values=target_cache, use_cache=True,
                         output_hidden_states=True)
            posterior = out.logits[0].argmax(-1)
            accepted = 0
            while accepted < verify - 1 and block[accepted + 1] == int(posterior[accepted]):
                accepted += 1
            new = (block[1:accepted + 1] + [int(posterior[accepted])])[:max_length - start - 1]
            for i, tok in enumerate(new):
                if tok in stop_ids:
                    new, stopped = new[:i + 1], True
                    break
            context = self.features(out.hidden_states)[0, :len(new)]
            tokens += new
            start += len(new)
            target_cache.crop(start)
            acceptance.append(len(new))
        return tokens, acceptance
