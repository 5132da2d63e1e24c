"""Hybrid recurrent causal LM (Qwen3.5 text layout, and Qwen3-Next: the same with sparse MoE MLPs):
Gated DeltaNet layers and gated full-attention layers, over a HybridCache (engine/recurrent_state.py:
KV for the attention layers, conv + recurrent state for the GDN layers, per-position snapshots for
verify blocks).

Same forward contract as TargetLM (ids, positions, cache, kv_len, feature_layers, logits_rows), so
the engine's step runner and loops drive it unchanged. Positions must be consecutive: a recurrent
state only moves forward.

Exactness: per-row arithmetic as transformers' Qwen3_5ForCausalLM torch path: zero-centred RMSNorms
((1 + w) in fp32), the GDN layer's conv / gates / recurrence / gated norm (models/gdn.py; on bf16
CUDA the kernels of kernels/gdn_fused.py and gdn_chain.py, within bf16 rounding of it), gated
attention with partial RoPE and q/k norms; projections fused ([qkv; z; b; a] for GDN, [q|gate; k; v]
for attention, [gate; up] for the MLP), which changes only GEMM rounding (one-token linears run
through our GEMV on bf16 CUDA, another fp32 summation order, as the dense target's). bf16 forwards
run the norms, the q/k norms with RoPE and the output gate in the forms of ops/zero_centred.py, each
residual add fused with the norm after it: same roundings, only the norms' fp32 sum-of-squares order
may differ. Prefills of more than MAX_SNAPSHOT_T tokens run the chunked GDN form (as transformers'
prefill), shorter calls the recurrent form (as its decode), keeping the state after every token.
"""
from __future__ import annotations

import torch
from torch import nn

from specpilot.kernels import gdn_chain, gdn_fused
from specpilot.kernels import gdn_tree as gdn_tree_kernels
from specpilot.ops import linear
from specpilot.ops import zero_centred
from specpilot.ops.attention import attend, attention_mask
from specpilot.ops.zero_centred import partial_rope

from . import gdn, gdn_tree
from .hybrid_config import HybridConfig
from .layers import SwiGLU, rope_table
from .moe import SparseMoE


def project(proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """proj(x): a one-token row through our GEMV (EngineConfig.fused_gemv, ops/linear.py), else
    linear.linear (the skinny GEMM for 2..16 rows, else torch)."""
    return linear.gemv(x, proj) if linear.gemv_takes(x, proj) else linear.linear(proj, x)


class GatedMLP(SwiGLU):
    """SwiGLU whose one-token calls are two GEMVs, the SiLU gate fused into the second (as the dense
    target's one-token block)."""

    def forward(self, x):
        if linear.gemv_takes(x, self.gate_up, self.down):
            return linear.silu_mul_gemv(linear.gemv(x, self.gate_up), self.down)
        return super().forward(x)


class ZeroCentredRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self.plus_one = zero_centred.PlusOne()

    def forward(self, x):
        return self.add_norm(x, None)[1]

    def add_norm(self, x, delta):
        """(x + delta, its norm), x itself without a delta (ops/zero_centred.py: one kernel on CUDA bf16)."""
        return zero_centred.add_zero_centred_rms_norm(x, delta, self.weight, self.plus_one, self.eps)


class GatedAttention(nn.Module):
    """Full attention whose q projection also yields a per-head output gate: out = attn * sigmoid(gate)."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.nq, self.nkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (2 * self.nq + 2 * self.nkv) * self.d, bias=False)  # [q|gate; k; v]
        self.o = nn.Linear(self.nq * self.d, cfg.hidden_size, bias=False)
        self.q_norm = ZeroCentredRMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(self.d, cfg.rms_norm_eps)
        self.scale = self.d ** -0.5
        self.qk_plus_one = zero_centred.PlusOne()

    def forward(self, x, cos, sin, positions, k_cache, v_cache, kv_len, mask, sin_rows=None):
        """sin_rows: zero_centred.rope_rows(sin) when the compact elementwise forms run (HybridLM
        decides once per forward), else None."""
        q, k, v, gate = self.heads(x, cos, sin, sin_rows)
        k_cache.index_copy_(2, positions, k)                                    # no host sync: graphs capture it
        v_cache.index_copy_(2, positions, v)
        out = attend(q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len], mask, self.scale)  # [B, T, Hq*D]
        return self.gated_output(out, gate, sin_rows is not None)

    def heads(self, x, cos, sin, sin_rows=None):
        """x [B, T, H] -> q [B, Hq, T, D], k, v [B, Hkv, T, D] (q and k normed and rotated) and the
        output gate (the batched engine attends over its paged cache between this and gated_output)."""
        b, t, _ = x.shape
        qg, k, v = project(self.qkv, x).split(
            (2 * self.nq * self.d, self.nkv * self.d, self.nkv * self.d), dim=-1)
        q, gate = qg.view(b, t, self.nq, 2 * self.d).chunk(2, dim=-1)          # per head: [query | gate]
        v = v.view(b, t, self.nkv, self.d).transpose(1, 2)
        if sin_rows is not None:       # the compact forms (ops/zero_centred.py): q and k normed and rotated together
            plus_one = self.qk_plus_one.get((self.q_norm.weight, self.k_norm.weight), (self.nq, self.nkv))
            q, k = zero_centred.compact_qk_norm_rope(q, k.view(b, t, self.nkv, self.d), plus_one, cos, sin_rows,
                                                     self.q_norm.eps)
            return q.transpose(1, 2), k.transpose(1, 2), v, gate
        gate = gate.reshape(b, t, self.nq * self.d)
        q = partial_rope(self.q_norm(q).transpose(1, 2), cos, sin)              # [B, Hq, T, D]
        k = partial_rope(self.k_norm(k.view(b, t, self.nkv, self.d)).transpose(1, 2), cos, sin)
        return q, k, v, gate

    def gated_output(self, out, gate, compact: bool):
        """The attention's output [B, T, Hq*D] -> times sigmoid(gate) -> output projection (compact: the
        gate read in place)."""
        return project(self.o, zero_centred.output_gate(out, gate) if compact else out * torch.sigmoid(gate))


class GatedDeltaNet(nn.Module):
    """The recurrent token mixer: fused projection [qkv; z; b; a], short causal conv over qkv, gates,
    the gated delta rule (models/gdn.py), gated RMSNorm, output projection."""

    def __init__(self, cfg: HybridConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim, self.conv_dim = cfg.key_dim, cfg.value_dim, cfg.conv_dim
        self.in_proj = nn.Linear(cfg.hidden_size, self.conv_dim + self.value_dim + 2 * self.nv, bias=False)
        self.conv_weight = nn.Parameter(torch.zeros(self.conv_dim, cfg.conv_kernel))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.norm_weight = nn.Parameter(torch.ones(self.dv))
        self.eps = cfg.rms_norm_eps
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)

    def forward(self, x, cache, every_position: bool, tree=None):
        """tree: TreeInputs (engine/tree/layout.py): x holds its nodes, each continuing its parent
        (models/gdn_tree.py); the per-node conv windows and states are stashed for the path commit."""
        b, t, _ = x.shape
        qkv, z, beta_in, a = self.project_in(x)
        conv_state, state = cache.layer_state(self.layer)
        # the cache's reserved buffers for this T (graphed steps write at fixed addresses), or None;
        # a tree's conv windows have another shape: only its per-node states go there
        window_out, states_out = (cache.buffers(self.layer, t) if every_position else None) or (None, None)
        if tree is None:
            out, window, snapshots = self.mix(qkv, beta_in, a, conv_state, state, every_position, window_out,
                                              states_out)
            cache.stash(self.layer, window, snapshots)
            return self.output(out, z, b, t)
        if gdn_tree_kernels.takes(qkv, self.conv_weight, self.dk, self.dv):
            return self._tree_kernels(qkv, z, beta_in, a, conv_state, state, cache, tree, states_out)
        mixed, window = gdn_tree.tree_conv(qkv, conv_state, self.conv_weight,
                                           tree.conv_window_index(self.conv_weight.shape[1]))
        beta, g = gdn.gates(beta_in, a, self.A_log, self.dt_bias)
        q, k, v = self._heads(mixed)
        out, snapshots = gdn_tree.tree_gated_delta_rule(q, k, v, g, beta, state, tree, states_out)
        cache.stash(self.layer, window, snapshots)
        return self.output(out, z, b, t)

    def project_in(self, x):
        """x [B, T, H] -> (qkv [B, T, C], z, b, a): the fused input projection, split."""
        return project(self.in_proj, x).split((self.conv_dim, self.value_dim, self.nv, self.nv), dim=-1)

    def mix(self, qkv, beta_in, a, conv_state, state, every_position: bool, window_out=None, states_out=None):
        """A chain of T tokens continuing the state (conv_state [B, C, K-1], state [B, H, Dk, Dv] fp32,
        neither written): the short conv, the gates and the delta rule -> (out [B, T, H, Dv], the conv
        window [B, C, K-1+T], states [B, T, H, Dk, Dv] after every token when every_position, else the
        final one [B, 1, H, Dk, Dv]). window_out / states_out: buffers to write those into (or None)."""
        if (every_position and gdn_chain.takes(qkv, self.dk, self.dv)
                and gdn_fused.takes_prologue(qkv, conv_state, self.conv_weight, (self.A_log, self.dt_bias))):
            # two CUDA kernels per layer: the prologue (conv window, conv, SiLU, gates), then the chain
            mixed, window, g, beta = gdn_fused.prologue(qkv, beta_in, a, conv_state, self.conv_weight, self.A_log,
                                                        self.dt_bias, window_out)
            out, snapshots = gdn_chain.gdn_chain(mixed, self.nk, self.dk, g, beta, state[0],
                                                 None if states_out is None else states_out[0])
            return out[None], window, snapshots[None]
        window = torch.cat([conv_state, qkv.transpose(1, 2)], dim=-1, out=window_out)   # [B, C, K-1+T]
        mixed = gdn.causal_conv(window, self.conv_weight).transpose(1, 2)   # [B, T, C]
        beta, g = gdn.gates(beta_in, a, self.A_log, self.dt_bias)
        if every_position and gdn_chain.takes(mixed, self.dk, self.dv):       # one CUDA kernel per layer
            out, snapshots = gdn_chain.gdn_chain(mixed[0].contiguous(), self.nk, self.dk, g[0], beta[0].float(),
                                                 state[0], None if states_out is None else states_out[0])
            return out[None], window, snapshots[None]
        q, k, v = self._heads(mixed)
        if every_position:
            out, _, snapshots = gdn.recurrent_gated_delta_rule(q, k, v, g, beta, state, keep_states=True,
                                                               states_out=states_out)
        else:
            out, final = gdn.chunked_gated_delta_rule(q, k, v, g, beta, state)
            snapshots = final[:, None]
        return out, window, snapshots

    def _heads(self, mixed):
        """The conv's output [B, T, C] -> q, k [B, T, Hv, Dk] (repeated to the value heads), v [B, T, Hv, Dv]."""
        b, t, _ = mixed.shape
        q, k, v = mixed.split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
        q, k = q.reshape(b, t, self.nk, self.dk), k.reshape(b, t, self.nk, self.dk)
        v = v.reshape(b, t, self.nv, self.dv)
        if self.nv > self.nk:
            q, k = (y.repeat_interleave(self.nv // self.nk, dim=2) for y in (q, k))
        return q, k, v

    def _tree_kernels(self, qkv, z, beta_in, a, conv_state, state, cache, tree, states_out=None):
        """The tree forward in two CUDA launches (kernels/gdn_tree.py): the conv over each node's
        ancestor window, then the recurrence from each node's parent state."""
        b, t = qkv.shape[:2]
        mixed, window = gdn_tree_kernels.tree_conv(qkv[0], conv_state[0], self.conv_weight,
                                                   tree.conv_window_index(self.conv_weight.shape[1]))
        beta, g = gdn.gates(beta_in[0], a[0], self.A_log, self.dt_bias)
        out, snapshots = gdn_tree_kernels.tree_recurrence(mixed, self.nk, self.dk, g, beta.float(), state[0],
                                                          tree.parents,
                                                          None if states_out is None else states_out[0])
        cache.stash(self.layer, window[None], snapshots[None])
        return self.output(out[None], z, b, t)

    def output(self, out, z, b: int, t: int):
        """out [B, T, H, Dv] of the delta rule -> gated RMSNorm -> output projection."""
        z = z.reshape(b, t, self.nv, self.dv)
        if gdn_fused.takes_gated_norm(out, z, self.norm_weight):
            out = gdn_fused.gated_norm(out, z, self.norm_weight, self.eps)
        else:
            out = gdn.gated_rms_norm(out, z, self.norm_weight, self.eps)
        return project(self.out_proj, out.reshape(b, t, self.value_dim))


class HybridBlock(nn.Module):
    """x + mixer(norm(x)), then + mlp(norm(x)); the mixer is GatedDeltaNet or GatedAttention."""

    def __init__(self, cfg: HybridConfig, layer: int):
        super().__init__()
        self.recurrent = cfg.layer_types[layer] == "linear_attention"
        self.attn_norm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mixer = GatedDeltaNet(cfg, layer) if self.recurrent else GatedAttention(cfg)
        self.mlp_norm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoE(cfg.hidden_size, cfg) if layer in cfg.moe_layers else \
            GatedMLP(cfg.hidden_size, cfg.intermediate_size)


class HybridLM(nn.Module):
    is_hybrid = True
    compiled_layers = None          # no compiled layers for hybrid targets (Engine: eager_reason)
    use_compiled = False

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(HybridBlock(cfg, i) for i in range(cfg.num_layers))
        self.norm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rope_cos = self.rope_sin = None

    @property
    def device(self):
        return self.embed.weight.device

    @property
    def dtype(self):
        return self.embed.weight.dtype

    def forward(self, ids, positions, cache, kv_len: int, feature_layers=(), logits_rows=None, head=None,
                tree=None):
        """ids [B, T] at consecutive positions [T]; cache: HybridCache. Returns (logits [B, T', V],
        features [B, T, F] or None) as TargetLM.forward: feature layer i is layer i's output (the last
        layer's after the final norm, as HF's hidden_states). head: as TargetLM.forward's. tree: as
        TargetLM.forward's (positions = the tree's slots); the cache then awaits commit_path."""
        every = cache.begin(int(positions[0]), ids.shape[1]) if tree is None else cache.begin_tree(tree)
        return self.forward_begun(ids, positions, cache, kv_len, every, feature_layers, logits_rows, head, tree)

    def forward_begun(self, ids, positions, cache, kv_len: int, every: bool, feature_layers=(), logits_rows=None,
                      head=None, tree=None):
        """forward's device work, after the cache's host bookkeeping (cache.begin / begin_tree, which
        returned `every`): no host sync and no branch on tensor values, so a CUDA graph can capture it
        (engine/hybrid_graphs.py) when the model has no sparse MoE (graph_blocker)."""
        x = self.embed(ids)
        rope = positions if tree is None else tree.rope_positions
        cos, sin = self.rope_cos[rope], self.rope_sin[rope]
        c = self.config
        sin_rows = zero_centred.rope_rows(sin) if zero_centred.takes(x) and c.attention_layers else None
        groups = c.num_heads // c.num_kv_heads
        mask = attention_mask(positions, kv_len, groups, x.dtype, writes_at_last=True) if tree is None \
            else tree.attention_mask(kv_len, groups, x.dtype)
        feats = {}
        last = len(self.layers) - 1
        delta = None                  # a layer's output is x + delta: each add runs fused with the next norm
        for i, layer in enumerate(self.layers):
            x, h = layer.attn_norm.add_norm(x, delta)
            if layer.recurrent:
                h = layer.mixer(h, cache, every, tree)
            else:
                j = cache.kv_index[i]
                h = layer.mixer(h, cos, sin, positions, cache.k[j], cache.v[j], kv_len, mask, sin_rows)
            x, h = layer.mlp_norm.add_norm(x, h)
            delta = layer.mlp(h)
            if i in feature_layers and i != last:
                x, delta = x + delta, None
                feats[i] = x
        _, x = self.norm.add_norm(x, delta)
        if last in feature_layers:
            feats[last] = x
        if logits_rows is not None:
            x = x[:, -logits_rows:]
        logits = project(self.lm_head, x) if head is None else head(x)
        features = torch.cat([feats[i] for i in feature_layers], dim=-1) if feature_layers else None
        return logits, features

    def ensure_rope(self, num_positions: int, device=None, dtype=None):
        """cos/sin tables [P, rotary_dim] (partial RoPE: only the first rotary_dim dims of a head turn)."""
        device, dtype = device or self.device, dtype or self.dtype
        if self.rope_cos is None or self.rope_cos.shape[0] < num_positions or self.rope_cos.device != device:
            self.rope_cos, self.rope_sin = rope_table(self.config.rope, self.config.rotary_dim, num_positions,
                                                      device, dtype)

    def prepare(self) -> None:
        """Nothing to build before the engine runs."""

    def graph_blocker(self):
        """Why this model's steps cannot be CUDA-graphed, or None when they can."""
        if self.config.moe_layers:
            return "its sparse MoE layers pick their experts on the host (models/moe.py)"
        return None

    def layer_fns(self):
        return self.layers
