"""DFlash block drafter over its own static KV cache (same arithmetic as dflash 0.1.0
`DFlashDraftModel`, which has no embedding or LM head: it borrows the target's).

Each layer's context K/V depend only on the injected target features (fc -> hidden_norm -> that
layer's k/v projections), not on the layer's input, so `write_context` fills the draft cache for
newly committed positions and `forward_block` runs the block [anchor, mask x (B-1)] with non-causal
attention over [cached context, block]. Slot index == absolute position, as in the target cache;
stock's "crop the draft cache to `start`" is implicit (the block's slots are overwritten later).

Exactness: per-row arithmetic as stock (k_norm on context and block K, RoPE at absolute positions,
SDPA without a causal mask); differs from stock only by kernel rounding (with the fused CUDA kernels
on bf16, ops/norm_rope.py, that includes the fp32 sum-of-squares order of the RMSNorms).
"""
from __future__ import annotations

import torch
from torch import nn

from specpilot import config as engine_config
from specpilot.ops import linear
from specpilot.ops.attention import attend, attention_mask
from specpilot.ops.norm_rope import add_rms_norm, qk_norm_rope_cache

from .config import DrafterConfig
from .draft_vocab import reduced_head_for
from .layers import PreNormBlock, RMSNorm, RopeTables


class DraftAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.nq, self.nkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q = nn.Linear(cfg.hidden_size, self.nq * self.d, bias=False)
        self.kv = nn.Linear(cfg.hidden_size, 2 * self.nkv * self.d, bias=False)   # [k; v] rows
        self.o = nn.Linear(self.nq * self.d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.scale = self.d ** -0.5

    def project_to_cache(self, x, cos, sin, positions, k_cache, v_cache, q=None):
        """x [B, T, H] -> k (normed, rotated) and v written into k/v_cache [B, Hkv, S, D] at `positions`.
        q [B, T, Hq*D] (the q projection, optional) -> returned normed and rotated, [B, Hq, T, D]."""
        b, t, _ = x.shape
        kv = linear.linear(self.kv, x)
        k, v = kv.view(b, t, 2 * self.nkv, self.d).split(self.nkv, dim=2)   # views of [k; v]
        if q is not None:
            q = q.view(b, t, self.nq, self.d)
        return qk_norm_rope_cache(q, k, v, None if q is None else self.q_norm.weight, self.k_norm.weight,
                                  cos, sin, positions, self.k_norm.eps, k_cache, v_cache)

    def forward(self, x, cos, sin, positions, k_cache, v_cache, kv_len, mask):
        q = self.project_to_cache(x, cos, sin, positions, k_cache, v_cache, q=linear.linear(self.q, x))
        out = attend(q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len], mask, self.scale)
        return linear.linear(self.o, out)


class DFlashDrafter(RopeTables, nn.Module):
    def __init__(self, cfg: DrafterConfig, target: nn.Module):
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList(
            PreNormBlock(cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps, DraftAttention(cfg))
            for _ in range(cfg.num_layers))
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # The target's embedding and LM head, shared (kept out of this module's parameters).
        self._target = [target]
        self.rope_cos = self.rope_sin = None

    @property
    def target(self):
        return self._target[0]

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def target_layer_ids(self) -> tuple:
        return self.config.target_layer_ids

    def write_context(self, features, positions, cache):
        """features [B, C, F] of the target at `positions` [C] -> context K/V into the draft cache."""
        h = self.hidden_norm(self.fc(features))               # [B, C, H]
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        for i, layer in enumerate(self.layers):
            layer.attn.project_to_cache(h, cos, sin, positions, cache.k[i], cache.v[i])

    def forward_block(self, block_ids, positions, cache, kv_len: int, last_visible=None):
        """block_ids [B, T] (anchor then masks) at `positions` [T] -> draft logits [B, T-1, V].

        Every query sees every cache slot up to the block's last position (non-causal), i.e. the
        committed context and the whole block. last_visible (int64 [1], optional) overrides that
        last slot: a block padded to a fixed size keeps its padding rows (at the trash slot) unseen.
        """
        scale = self.config.input_embedding_scale
        x, delta = self.target.embed(block_ids), None        # a layer's output is x + delta (PreNormBlock)
        if scale != 1.0:
            x = x * scale
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        c = self.config
        last = positions[-1:] if last_visible is None else last_visible.reshape(1)
        mask = attention_mask(last.expand(positions.shape[0]), kv_len, c.num_heads // c.num_kv_heads,
                              x.dtype)                                      # non-causal: one last slot
        if self.use_compiled and self.compiled_layers:
            mask = mask.built()
        for i, layer in enumerate(self.layer_fns()):
            _, x, delta = layer(x, delta, cos, sin, positions, cache.k[i], cache.v[i], kv_len, mask)
        _, x = add_rms_norm(x, delta, self.norm.weight, self.norm.eps)   # the last layer's add + final norm
        return self.compute_logits(x[:, 1:])

    def compute_logits(self, hidden):
        """Stock `compute_logits`: target LM head, then output_multiplier and tanh softcapping. With
        EngineConfig.draft_vocab the head covers the kept tokens only, -inf elsewhere (draft_vocab.py)."""
        reduced = reduced_head_for(self, engine_config.current())
        logits = linear.linear(self.target.lm_head, hidden) if reduced is None else reduced.logits(hidden)
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap is not None and cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits if reduced is None else reduced.expand(logits)

    def rope_device(self):
        return self.target.device

    def rope_dtype(self):
        return self.target.dtype

    # Compiled layer forwards (Engine(compile_layers=True)) are switched on only while a fixed-shape
    # step is traced for CUDA-graph capture; everything else runs the plain modules.
    compiled_layers = None
    use_compiled = False

    def layer_fns(self):
        return self.compiled_layers if self.use_compiled and self.compiled_layers else self.layers
