"""Random-weight hybrid (Qwen3.5 layout) targets: presets, in-memory models, HF config dicts.

Presets: `tiny-qwen3.5` (CPU tests: 4 layers, 3 GDN + 1 gated attention), `tiny-qwen3.5-27b` (the same
with the 27B's head groups: 3 GDN value heads per key head, 6 query heads per KV head), `tiny-qwen3-next` (the
same with a 4-expert top-2 MoE + shared expert in layers 0, 2, 3), `qwen3.5-9b`
(transformers' default Qwen3_5TextConfig: hidden 4096, 32 layers, 16/32 GDN key/value heads of 128,
vocab 248320) and `qwen3.5-27b` (a 27B-class shape: hidden 5120, 64 layers, 16/48 GDN heads, 24/4
attention heads of 256, intermediate 17408; parameter count ~27B).

Init (as random_ckpt's dense one, so greedy near-ties stay rare): embeddings N(0, 1), linears
N(0, 1/fan_in), zero-centred norms N(0, 0.1^2) (scale 1 + w), the gated norm 1 + N(0, 0.1^2), conv
N(0, 1/K), A_log = log U(1, 8) and dt_bias N(0, 1) (decays exp(g) spread over (0, 1)).
"""
from __future__ import annotations

import torch

from .config import RopeConfig
from .hybrid import HybridLM
from .hybrid_config import HybridConfig


def _layer_types(n: int, interval: int = 4) -> tuple:
    return tuple("linear_attention" if (i + 1) % interval else "full_attention" for i in range(n))


HYBRID_PRESETS = {
    "tiny-qwen3.5": HybridConfig("qwen3_5", 320, 64, _layer_types(4), 4, 2, 16, 0.5, 2, 4, 16, 16, 4, 128, 1e-6,
                                 RopeConfig(10000.0), False, 2048),
    "tiny-qwen3.5-27b": HybridConfig("qwen3_5", 320, 64, _layer_types(4), 6, 1, 16, 0.5, 2, 6, 16, 16, 4, 128,
                                     1e-6, RopeConfig(10000.0), False, 2048),
    "tiny-qwen3-next": HybridConfig("qwen3_next", 320, 64, _layer_types(4), 4, 2, 16, 0.5, 2, 4, 16, 16, 4, 96,
                                    1e-6, RopeConfig(10000.0), False, 2048, moe_layers=(0, 2, 3), num_experts=4,
                                    num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=48),
    "qwen3.5-9b": HybridConfig("qwen3_5", 248320, 4096, _layer_types(32), 16, 4, 256, 0.25, 16, 32, 128, 128, 4,
                               12288, 1e-6, RopeConfig(10000.0), False, 32768),
    "qwen3.5-27b": HybridConfig("qwen3_5", 248320, 5120, _layer_types(64), 24, 4, 256, 0.25, 16, 48, 128, 128, 4,
                                17408, 1e-6, RopeConfig(10000000.0), False, 262144),
}


@torch.no_grad()
def fill_random_hybrid(model: HybridLM, device, dtype, seed: int) -> None:
    gen = torch.Generator(device=device).manual_seed(seed)
    model.to(dtype)
    model.to_empty(device=device)

    def randn(shape):
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("norm.weight"):                  # zero-centred RMSNorms: scale 1 + w
            p.copy_(0.1 * randn(p.shape))
        elif leaf == "norm_weight":                       # the GDN's gated norm: plain scale
            p.copy_(1 + 0.1 * randn(p.shape))
        elif leaf == "A_log":
            p.copy_(torch.empty(p.shape, device=device).uniform_(1.0, 8.0, generator=gen).log())
        elif leaf == "dt_bias":
            p.copy_(randn(p.shape))
        elif leaf == "conv_weight":
            p.copy_(randn(p.shape) / p.shape[1] ** 0.5)
        elif p.dim() == 3:                                 # MoE experts [E, out, in]
            p.copy_(randn(p.shape) / p.shape[-1] ** 0.5)
        elif name.startswith("embed"):
            p.copy_(randn(p.shape))
        else:   # chunked so a 9B-size matrix never needs an fp32 copy of itself
            for r0 in range(0, p.shape[0], 8192):
                rows = min(8192, p.shape[0] - r0)
                p[r0:r0 + rows].copy_(randn((rows, p.shape[1])) / p.shape[1] ** 0.5)



def hf_hybrid_config(cfg: HybridConfig, eos_token_id: int) -> dict:
    """config.json of a Qwen3_5ForCausalLM (`qwen3_5_text`) or Qwen3NextForCausalLM for `cfg`."""
    if cfg.family == "qwen3_next":
        moe = {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
               "moe_intermediate_size": cfg.moe_intermediate_size, "norm_topk_prob": cfg.norm_topk_prob,
               "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size, "decoder_sparse_step": 1,
               "mlp_only_layers": [i for i in range(cfg.num_layers) if i not in cfg.moe_layers]}
        return {**_hf_text_config(cfg, eos_token_id), "architectures": ["Qwen3NextForCausalLM"],
                "model_type": "qwen3_next", **moe}
    return _hf_text_config(cfg, eos_token_id)


def _hf_text_config(cfg: HybridConfig, eos_token_id: int) -> dict:
    return {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers, "layer_types": list(cfg.layer_types),
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "linear_num_key_heads": cfg.linear_num_key_heads, "linear_num_value_heads": cfg.linear_num_value_heads,
            "linear_key_head_dim": cfg.linear_key_head_dim, "linear_value_head_dim": cfg.linear_value_head_dim,
            "linear_conv_kernel_dim": cfg.conv_kernel, "intermediate_size": cfg.intermediate_size,
            "rms_norm_eps": cfg.rms_norm_eps, "hidden_act": "silu", "attention_bias": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope.theta,
                                "partial_rotary_factor": cfg.partial_rotary_factor},
            "tie_word_embeddings": cfg.tie_word_embeddings, "max_position_embeddings": cfg.max_position_embeddings,
            "eos_token_id": eos_token_id, "bos_token_id": eos_token_id, "use_cache": True}
