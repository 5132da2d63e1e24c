"""DFlash2 block drafter (stock: dflash 0.1.0 `DFlash2DraftModel`): the DFlash drafter plus
  - a grouped dynamic causal conv around each sublayer (attention and MLP) along the block axis,
  - per-layer attention masks ("sliding_attention" layers are causal within a window),
  - the candidate selector instead of argmax: top-k of the logits, then a left-to-right walk
    scoring each candidate by unary + <P[prev] * hidden_projection(h), S[candidate]>.

Exactness: the same operations in the same order as stock (the conv's per-offset multiply-add, the
selector's einsum, topk unsorted), so fp32 CPU runs give stock's tokens and acceptance lengths; at
T > 0 the same random draws in the same order (one multinomial per block position in the selector,
then rejection sampling over the selector's sparse distribution, densified: p - q is the same float
as stock's scatter_add of -q).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.engine.block_draft import block_draft
from specpilot.ops import linear
from specpilot.ops.attention import AttentionMask, attention_mask
from specpilot.ops.norm_rope import add_rms_norm
from specpilot.verify.sampling import sample_probs, sampling_probs

from ..config import DrafterConfig, block_drafter_fields
from ..drafter import DFlashDrafter, DraftAttention
from ..layers import PreNormBlock

ARCHITECTURE = "DFlash2DraftModel"


@dataclass(frozen=True)
class DFlash2Config(DrafterConfig):
    conv_kernel_size: int = 4
    conv_group_size: int = 1
    selector_rank: int = 8
    selector_top_k: int = 8
    layer_types: tuple = ()                 # per layer: "full_attention" | "sliding_attention"
    sliding_window: int | None = None
    is_causal: bool | None = None           # stock's override of every layer's causality


def dflash2_config_from_dict(cfg: dict, where: str = "drafter") -> DFlash2Config:
    dcfg = cfg.get("dflash_config")
    if not isinstance(dcfg, dict):
        raise ValueError(f"{where}: a DFlash2 drafter's config.json needs a 'dflash_config' object")
    value = lambda name, default=None: dcfg.get(name, cfg.get(name, default))
    missing = [n for n in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
               if value(n) is None]
    if missing:
        raise ValueError(f"{where}: DFlash2 dflash_config lacks {missing}")
    fields = block_drafter_fields(cfg, dcfg, where)
    layer_types = tuple(cfg.get("layer_types") or ("full_attention",) * fields["num_layers"])
    if len(layer_types) != fields["num_layers"] or set(layer_types) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"{where}: layer_types {list(layer_types)} must name full_attention or sliding_attention "
                         f"for each of the {fields['num_layers']} layers")
    window = cfg.get("sliding_window")
    if "sliding_attention" in layer_types and not (isinstance(window, int) and window > 0):
        raise ValueError(f"{where}: sliding_attention layers need a positive sliding_window, got {window!r}")
    c = DFlash2Config(**fields, conv_kernel_size=int(value("conv_kernel_size")),
                      conv_group_size=int(value("conv_group_size")), selector_rank=int(value("selector_rank")),
                      selector_top_k=int(value("selector_top_k")), layer_types=layer_types,
                      sliding_window=window, is_causal=cfg.get("is_causal"))
    if c.conv_kernel_size < 1 or c.conv_group_size < 1 or c.hidden_size % c.conv_group_size:
        raise ValueError(f"{where}: conv_kernel_size {c.conv_kernel_size} must be >= 1 and conv_group_size "
                         f"{c.conv_group_size} must divide hidden_size {c.hidden_size}")
    if not 1 <= c.selector_top_k <= c.vocab_size or c.selector_rank < 1:
        raise ValueError(f"{where}: selector_top_k {c.selector_top_k} must be in 1..vocab and selector_rank >= 1")
    return c


class GroupedDynamicCausalConv(nn.Module):
    """out_t = sum_o (base[o] + dyn_t[o, group]) * x_{t-o} along the block axis (zero before the
    block's first row). prepare() runs taps base[0] with the first half of the dynamic kernel on the
    sublayer's input; finish() runs base[1] with the second half (computed from that same input)."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)

    def prepare(self, x):
        dynamic = linear.linear(self.kernel_projection, x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        return self.convolve(x, dynamic[..., 0, :, :], self.base_kernel[0]), dynamic[..., 1, :, :]

    def finish(self, y, dynamic):
        return self.convolve(y, dynamic, self.base_kernel[1])

    def convolve(self, x, dynamic, base):
        b, t, h = x.shape
        blocks = x.view(b, t, self.groups, self.group_size)
        dynamic = dynamic.reshape(b, t, self.kernel_size, self.groups, 1)
        out = torch.zeros_like(blocks)
        # Stock's order: base tap, then the dynamic tap. Taps at offsets >= t see only zero padding (they
        # add exact zeros); stock's padding breaks on them (blocks shorter than kernel_size - 1).
        for offset in range(min(self.kernel_size, t)):
            shifted = blocks if offset == 0 else F.pad(blocks[:, :-offset], (0, 0, 0, 0, offset, 0))
            out = out + base[offset].view(1, 1, self.groups, self.group_size).to(x.dtype) * shifted
            out = torch.addcmul(out, dynamic[:, :, offset], shifted)
        return out.view(b, t, h)


class ConvBlock(PreNormBlock):
    """PreNormBlock with a GroupedDynamicCausalConv around the attention and around the MLP."""

    def __init__(self, cfg: DFlash2Config):
        super().__init__(cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps, DraftAttention(cfg))
        self.attn_conv = GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
        self.mlp_conv = GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    def forward(self, x, delta, cos, sin, positions, k_cache, v_cache, kv_len, mask):
        block_input, normed = add_rms_norm(x, delta, self.attn_norm.weight, self.attn_norm.eps)
        normed, dynamic = self.attn_conv.prepare(normed)
        attn_out = self.attn_conv.finish(self.attn(normed, cos, sin, positions, k_cache, v_cache, kv_len, mask),
                                         dynamic)
        h, normed = add_rms_norm(block_input, attn_out, self.mlp_norm.weight, self.mlp_norm.eps)
        normed, dynamic = self.mlp_conv.prepare(normed)
        return block_input, h, self.mlp_conv.finish(self.mlp(normed), dynamic)


class CandidateSelector(nn.Module):
    def __init__(self, cfg: DFlash2Config):
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.predecessor_codebook = nn.Embedding(cfg.vocab_size, cfg.selector_rank)
        self.successor_codebook = nn.Embedding(cfg.vocab_size, cfg.selector_rank)
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    def select(self, hidden, logits, anchor_ids, temperature: float, generator=None):
        """hidden [B, K, H], logits [B, K, V], anchor_ids [B] -> (path [B, K], candidates [B, K, top_k],
        q [B, K, top_k] fp32 over the candidates, or None at T = 0)."""
        unary, candidates = torch.topk(logits, self.top_k, dim=-1, sorted=False)
        hidden = linear.linear(self.hidden_projection, hidden)
        predecessor, path, q_rows = anchor_ids, [], []
        for position in range(hidden.shape[1]):      # sequential: each step conditions on the last pick
            scores = unary[:, position] + torch.einsum(
                "br,bkr->bk", self.predecessor_codebook(predecessor) * hidden[:, position],
                self.successor_codebook(candidates[:, position]))
            if temperature > 0:
                q = sampling_probs(scores, temperature)
                index = sample_probs(q, generator)
                q_rows.append(q)
            else:
                index = torch.argmax(scores, dim=-1)
            predecessor = candidates[:, position].gather(-1, index[:, None])[:, 0]
            path.append(predecessor)
        return torch.stack(path, dim=1), candidates, torch.stack(q_rows, dim=1) if q_rows else None


def layer_mask(cfg: DFlash2Config, layer: int, positions, kv_len: int, dtype) -> AttentionMask:
    """Stock's per-layer visibility over cache slots [0, kv_len) (slot == absolute position): every
    slot up to the block's last position for a full layer; for a sliding layer also key j <= position
    (causal) and position - j < window (and, non-causal with a window, j - position < window). A
    graphed step's kv_len is a bucket past the block: its later slots (stale, or the trash slot of
    padded context rows) stay unseen."""
    kind = cfg.layer_types[layer]
    causal = kind == "sliding_attention" if cfg.is_causal is None else bool(cfg.is_causal)
    window = cfg.sliding_window if kind == "sliding_attention" else None
    groups = cfg.num_heads // cfg.num_kv_heads
    if not causal and window is None:
        return attention_mask(positions[-1:].expand(positions.shape[0]), kv_len, groups, dtype)
    key, query = torch.arange(kv_len, device=positions.device)[None, :], positions[:, None]
    visible = (key <= positions[-1]).expand(query.shape[0], kv_len).clone()   # slots past the block: unseen
    if causal:
        visible &= key <= query
    if window is not None:
        visible &= query - key < window
        if not causal:
            visible &= key - query < window
    additive = torch.zeros(visible.shape, dtype=dtype, device=positions.device).masked_fill_(~visible, float("-inf"))
    return AttentionMask(additive.repeat(groups, 1)[None, None], None)


class DFlash2Drafter(DFlashDrafter):
    kind = "dflash2"

    def __init__(self, cfg: DFlash2Config, target: nn.Module):
        super().__init__(cfg, target)
        self.layers = nn.ModuleList(ConvBlock(cfg) for _ in range(cfg.num_layers))
        self.candidate_selector = CandidateSelector(cfg)

    def forward_hidden(self, block_ids, positions, cache, kv_len: int):
        """block_ids [B, T] (anchor then masks) at `positions` [T] -> final-normed hidden [B, T-1, H] of
        rows 1..T-1 (the drafting rows; stock's `draft_hidden`)."""
        x, delta = self.target.embed(block_ids), None
        if self.config.input_embedding_scale != 1.0:
            x = x * self.config.input_embedding_scale
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        for i, layer in enumerate(self.layers):
            mask = layer_mask(self.config, i, positions, kv_len, x.dtype)
            _, x, delta = layer(x, delta, cos, sin, positions, cache.k[i], cache.v[i], kv_len, mask)
        _, x = add_rms_norm(x, delta, self.norm.weight, self.norm.eps)
        return x[:, 1:]

    def after_load(self) -> None:
        """Nothing to tie: the embedding and LM head are the target's."""

    def session(self, engine, block_size: int):
        return DFlash2Session(engine, block_size)

    def forward_block(self, block_ids, positions, cache, kv_len: int, last_visible=None):
        raise NotImplementedError("DFlash2 drafts through its selector (DFlash2Session), not forward_block's argmax")

    def propose(self, hidden, anchor_ids, temperature: float, generator=None):
        """Stock's `propose`: (drafts [B, K], candidates [B, K, top_k], q [B, K, top_k] or None)."""
        return self.candidate_selector.select(hidden, self.compute_logits(hidden), anchor_ids, temperature, generator)


def dense_draft_probs(candidates, q, vocab: int):
    """The selector's sparse q over its (distinct) candidates as a dense [B, K, V] distribution."""
    return torch.zeros(*q.shape[:-1], vocab, dtype=q.dtype, device=q.device).scatter_(-1, candidates, q)


class DFlash2Session:
    """Per-generation drafting state (engine/spec_session.py's interface): the target features not yet
    in the draft cache, as DFlash; drafts from the selector."""
    uses_features = True

    def __init__(self, engine, block_size: int):
        self.engine, self.drafter, self.block_size = engine, engine.drafter, block_size
        self.ctx = self.ctx_start = None

    def begin(self, prompt_ids, first_token: int, features) -> None:
        self.ctx, self.ctx_start = features, 0

    def propose(self, anchor: int, start: int, num_drafts: int, temperature: float, generator):
        d = self.drafter
        t = num_drafts + 1
        block = torch.full((1, t), d.mask_token_id, dtype=torch.long, device=self.ctx.device)
        block[0, 0] = anchor
        if temperature > 0:                              # sampled: eager (host generator)
            positions = torch.arange(self.ctx_start, self.ctx_start + self.ctx.shape[1], device=block.device)
            hidden = self._hidden(self.ctx, positions, block, torch.arange(start, start + t, device=block.device),
                                  start + t)
            with self.engine.runner.kernel_ctx(t):
                drafts, candidates, q = d.propose(hidden, block[:, 0], temperature, generator)
            return drafts, dense_draft_probs(candidates, q, d.config.vocab_size)
        return block_draft(self.engine, "dflash2", self._greedy, self.ctx, self.ctx_start, block, start,
                           self.block_size), None

    def _hidden(self, ctx, ctx_positions, block, block_positions, kv_len):
        d, cache = self.drafter, self.engine.draft_cache
        with self.engine.runner.kernel_ctx(block.shape[1]):
            d.write_context(ctx, ctx_positions, cache)
            return d.forward_hidden(block, block_positions, cache, kv_len)

    def _greedy(self, ctx, ctx_positions, block, block_positions, kv_len):
        hidden = self._hidden(ctx, ctx_positions, block, block_positions, kv_len)
        with self.engine.runner.kernel_ctx(block.shape[1]):
            return self.drafter.propose(hidden, block[:, 0], 0.0)[0]

    def accept(self, new_tokens: list, start: int, features) -> None:
        self.ctx, self.ctx_start = features[:, :len(new_tokens)], start


# -- checkpoint names: stock's modules (attention_conv / mlp_conv, codebooks stored without ".weight",
# as the published checkpoints are; stock's from_pretrained maps them) <-> ours ---------------------
_CONV = (("attention_conv", "attn_conv"), ("mlp_conv", "mlp_conv"))
_CODEBOOKS = ("predecessor_codebook", "successor_codebook")


def dflash2_from_hf(hf: dict, cfg: DFlash2Config, where: str) -> dict:
    from .. import hf_names

    hf, ours = dict(hf), {}
    for i in range(cfg.num_layers):
        for theirs, mine in _CONV:
            for leaf in ("base_kernel", "kernel_projection.weight"):
                ours[f"layers.{i}.{mine}.{leaf}"] = hf_names.take(hf, f"layers.{i}.{theirs}.{leaf}", where)
    for name in _CODEBOOKS:
        key = f"candidate_selector.{name}"
        ours[key + ".weight"] = hf.pop(key) if key in hf else hf_names.take(hf, key + ".weight", where)
    ours["candidate_selector.hidden_projection.weight"] = hf_names.take(
        hf, "candidate_selector.hidden_projection.weight", where)
    return {**hf_names.drafter_from_hf(hf, cfg, where), **ours}


def dflash2_to_hf(ours: dict, cfg: DFlash2Config) -> dict:
    from .. import hf_names

    rest = {k: v for k, v in ours.items() if "_conv." not in k and not k.startswith("candidate_selector.")}
    hf = hf_names.drafter_to_hf(rest, cfg)
    for i in range(cfg.num_layers):
        for theirs, mine in _CONV:
            for leaf in ("base_kernel", "kernel_projection.weight"):
                hf[f"layers.{i}.{theirs}.{leaf}"] = ours[f"layers.{i}.{mine}.{leaf}"]
    for name in _CODEBOOKS:
        hf[f"candidate_selector.{name}"] = ours[f"candidate_selector.{name}.weight"]
    hf["candidate_selector.hidden_projection.weight"] = ours["candidate_selector.hidden_projection.weight"]
    return {k: v.contiguous() for k, v in hf.items()}


def hf_dflash2_config(cfg: DFlash2Config, target) -> dict:
    """config.json of a DFlash2 drafter (the DFlash one plus its dflash_config keys and layer types)."""
    from ..random_ckpt import hf_drafter_config

    out = hf_drafter_config(cfg, target)
    out["architectures"] = [ARCHITECTURE]
    out["dflash_config"].update(conv_kernel_size=cfg.conv_kernel_size, conv_group_size=cfg.conv_group_size,
                                selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k)
    out["layer_types"] = list(cfg.layer_types)
    if cfg.sliding_window is not None:    # transformers' Qwen3Config keeps the window only with use_sliding_window
        out.update(sliding_window=cfg.sliding_window, use_sliding_window=True)
    return out
