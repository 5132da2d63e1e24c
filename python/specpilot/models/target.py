"""Dense causal LM (Qwen3 or LLaMA-3.x) over a static KV cache, gpt-fast style.

Fused projections are plain `nn.Linear` attributes (`qkv`, `o`, `mlp.gate_up`, `mlp.down`,
`lm_head`) so `specpilot.formats.split12.linear.swap_linears(model)` can replace them.

Cache convention: slot index == absolute position, so attention visibility is purely positional
(key slot j visible to a query at position p iff j <= p). "Cropping" a cache is free: rejected
positions are simply overwritten by the next write at that position.

Exactness: same per-row arithmetic as HF Qwen3ForCausalLM / LlamaForCausalLM; outputs differ from HF
only by GEMM / attention kernel rounding (fused QKV and gate/up change the GEMM shapes) and, with the
fused CUDA kernels on bf16 (ops/norm_rope.py), by the fp32 sum-of-squares order of the RMSNorms; with
EngineConfig.fused_gemv on, one-token steps run their linears through our GEMV (another fp32 summation order).
"""
from __future__ import annotations

import torch
from torch import nn

from specpilot.kernels.decode_attention import decode_attention_rope, fused_rope_enabled

from specpilot.ops import linear
from specpilot.ops.attention import AttentionMask, attend, attention_mask, use_decode_kernel
from specpilot.ops.norm_rope import add_rms_norm, qk_norm_rope_cache, rope_kernel_takes

from .config import TargetConfig
from .layers import PreNormBlock, RMSNorm, RopeTables


class Attention(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.nq, self.nkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.d, bias=False)
        self.o = nn.Linear(self.nq * self.d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = self.d ** -0.5

    def forward(self, x, cos, sin, positions, k_cache, v_cache, kv_len, mask):
        # x [B, T, H]; cos/sin [T, D]; positions [T]; k/v_cache [B, Hkv, S, D]; mask [1, 1, g*T, kv_len]
        qkv = linear.linear(self.qkv, x)
        out = self.attend_qkv(qkv, cos, sin, positions, k_cache, v_cache, kv_len, mask)
        return linear.linear(self.o, out)

    def attend_qkv(self, qkv, cos, sin, positions, k_cache, v_cache, kv_len, mask):
        """Attention from the QKV projection's output [B, T, (Hq + 2 Hkv) D]: [B, T, Hq D], before O."""
        b, t, _ = qkv.shape
        qkv = qkv.view(b, t, self.nq + 2 * self.nkv, self.d)
        q, k, v = qkv.split((self.nq, self.nkv, self.nkv), dim=2)        # views, no copy
        qk_norm = self.q_norm is not None                                # Qwen3: per-head RMSNorm of q and k
        q_weight, k_weight = (self.q_norm.weight, self.k_norm.weight) if qk_norm else (None, None)
        if t == 1 and self._rope_in_attention(qkv, q, k, v, q_weight, k_weight, cos, sin, positions, k_cache,
                                              v_cache, kv_len, mask):
            return decode_attention_rope(qkv.view(b, 1, -1), q_weight, k_weight, cos, sin, positions, self.eps,
                                         k_cache, v_cache, kv_len, self.scale, self.nq)
        q = qk_norm_rope_cache(q, k, v, q_weight, k_weight, cos, sin, positions, self.eps,
                               k_cache, v_cache)                         # q [B, Hq, T, D]; k/v -> cache
        return attend(q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len], mask, self.scale)

    @staticmethod
    def _rope_in_attention(qkv, q, k, v, q_weight, k_weight, cos, sin, positions, k_cache, v_cache, kv_len, mask):
        """Whether a one-token step runs its rope / cache write inside the attention kernel: exactly when
        both the rope kernel and our attention kernel would take the call, on a causal step."""
        return (qkv.is_cuda and isinstance(mask, AttentionMask) and mask.writes_at_last and fused_rope_enabled()
                and qkv.is_contiguous()
                and rope_kernel_takes(q, k, v, q_weight, k_weight, cos, sin, positions, k_cache, v_cache)
                and use_decode_kernel(q.transpose(1, 2), k_cache[:, :, :kv_len], mask))


class TargetBlock(PreNormBlock):
    """The target's decoder block. A one-token step with the fused GEMV on (ops/linear.py) runs each
    linear as a GEMV with the norm or SwiGLU gate before it fused in; every other call is PreNormBlock's."""

    def forward(self, x, delta, cos, sin, positions, k_cache, v_cache, kv_len, mask):
        attn, mlp = self.attn, self.mlp
        if not linear.gemv_takes(x, attn.qkv, attn.o, mlp.gate_up, mlp.down, norm_hidden=x.shape[-1]):
            return super().forward(x, delta, cos, sin, positions, k_cache, v_cache, kv_len, mask)
        block_input, qkv = linear.norm_gemv(x, delta, self.attn_norm.weight, self.attn_norm.eps, attn.qkv)
        attn_out = attn.attend_qkv(qkv, cos, sin, positions, k_cache, v_cache, kv_len, mask)
        h, gate_up = linear.norm_gemv(block_input, linear.gemv(attn_out, attn.o),
                                             self.mlp_norm.weight, self.mlp_norm.eps, mlp.gate_up)
        return block_input, h, linear.silu_mul_gemv(gate_up, mlp.down)


class TargetLM(RopeTables, nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            TargetBlock(cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps, Attention(cfg))
            for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rope_cos = self.rope_sin = None                   # [max_pos, D], set by set_rope_table

    @property
    def device(self):
        return self.embed.weight.device

    @property
    def dtype(self):
        return self.embed.weight.dtype

    def forward(self, ids, positions, cache, kv_len: int, feature_layers=(), logits_rows=None, head=None,
                tree=None):
        """ids [B, T], positions [T] (int64, absolute; also the cache slots written), cache: KVCache.

        Attends to cache slots [0, kv_len) with key slot <= query position. Returns (logits
        [B, T', V] with T' = T or only the last `logits_rows` rows, features [B, T, F] or None) where
        features concatenates the outputs of `feature_layers` (HF `hidden_states[i + 1]`: the output of
        layer i; for the last layer HF reports the final-normed state, and so do we). head: a callable
        replacing the LM head on the final-normed rows (engine/certified_head.py), or None. tree:
        TreeInputs (engine/tree/layout.py): ids are its nodes, `positions` their scratch slots; rotated
        at their depth's position, each attending to the committed slots and its ancestors.
        """
        x, delta = self.embed(ids), None                       # [B, T, H]; a layer's output is x + delta
        rope = positions if tree is None else tree.rope_positions
        cos, sin = self.rope_cos[rope], self.rope_sin[rope]
        c = self.config
        if tree is None:
            mask = attention_mask(positions, kv_len, c.num_heads // c.num_kv_heads, x.dtype,
                                  writes_at_last=True)  # causal: row t sees slots <= positions[t]
        else:
            mask = tree.attention_mask(kv_len, c.num_heads // c.num_kv_heads, x.dtype)
        if self.use_compiled and self.compiled_layers:
            mask = mask.built()
        feats = {}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layer_fns()):
            # Layer i materialises its input, the output of layer i - 1 (PreNormBlock fuses the adds).
            block_input, x, delta = layer(x, delta, cos, sin, positions, cache.k[i], cache.v[i], kv_len, mask)
            if i > 0 and i - 1 in feature_layers:
                feats[i - 1] = block_input
        if head is None and last not in feature_layers and linear.gemv_takes(x, self.lm_head, norm_hidden=x.shape[-1]):
            # one token: the final add + norm fused into the LM head's GEMV (logits_rows changes nothing)
            _, logits = linear.norm_gemv(x, delta, self.norm.weight, self.norm.eps, self.lm_head,
                                                keep_sum=False)
        else:
            _, x = add_rms_norm(x, delta, self.norm.weight, self.norm.eps)   # the last layer's add + final norm
            if last in feature_layers:
                feats[last] = x
            if logits_rows is not None:
                x = x[:, -logits_rows:]
            logits = linear.linear(self.lm_head, x) if head is None else head(x)
        features = torch.cat([feats[i] for i in feature_layers], dim=-1) if feature_layers else None
        return logits, features

    def rope_device(self):
        return self.device

    def rope_dtype(self):
        return self.dtype

    # Compiled layer forwards (Engine(compile_layers=True)) are switched on only while a fixed-shape
    # step is traced for CUDA-graph capture; everything else runs the plain modules.
    compiled_layers = None
    use_compiled = False

    def prepare(self) -> None:
        """Called by the Engine before any graph capture or compile trace. Nothing needs building now:
        the q/k norm weights are read per head by qk_norm_rope_cache as they are."""

    def layer_fns(self):
        return self.compiled_layers if self.use_compiled and self.compiled_layers else self.layers
