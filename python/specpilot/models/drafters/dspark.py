"""DSpark block drafter (deepseek-ai/DeepSpec: `deepspec/modeling/dspark`, `deepspec/eval/dspark`).

The backbone is DFlash's (target features injected as context K/V, non-causal attention over
[context, block]) with its own embedding and LM head. The block is [anchor, mask x (K - 1)] and
every one of its K rows drafts (row k predicts the token after position start + k): K drafts from a
K-row block, verified as a K + 1 block (the engine's block_size = the checkpoint's block_size + 1).
A shorter verify block (the tail, or a smaller --block-size) runs a block of that many drafting
rows, as stock DFlash shortens its tail block.

Sequential Markov head ("vanilla"): logits_k = base_k + W2(W1[x_{k-1}]) with x_0 the anchor and x_k
the draft picked at row k (argmax at T = 0, else a sample of softmax(logits_k / T), which is also
the draft distribution for rejection sampling). Confidence head: sigmoid(Linear([h_k; W1[x_{k-1}]]))
per row, kept on the session for verify-length scheduling; it never touches acceptance.

Checkpoint names: the published Qwen3DSparkModel's (embed_tokens, layers.*, norm, fc, hidden_norm,
lm_head, markov_head.markov_w1 / markov_w2, confidence_head.proj).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specpilot.engine.block_draft import block_draft
from specpilot.ops import linear
from specpilot.ops.attention import attention_mask
from specpilot.ops.norm_rope import add_rms_norm
from specpilot.verify.sampling import sample_probs, sampling_probs

from ..config import DrafterConfig, block_drafter_fields
from ..drafter import DFlashDrafter


@dataclass(frozen=True)
class DSparkConfig(DrafterConfig):
    markov_rank: int = 256
    confidence_head: bool = True
    confidence_with_markov: bool = True


def dspark_config_from_dict(cfg: dict, where: str = "drafter") -> DSparkConfig:
    dcfg = cfg.get("dspark_config") if isinstance(cfg.get("dspark_config"), dict) else {}
    value = lambda name, default=None: dcfg.get(name, cfg.get(name, default))
    kind = value("markov_head_type", "vanilla")
    if kind != "vanilla":
        raise ValueError(f"{where}: markov_head_type {kind!r} is not supported (vanilla only)")
    rank = value("markov_rank")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{where}: markov_rank must be a positive int, got {rank!r} (markov_rank 0, no Markov "
                         f"head, is not supported)")
    layer_types = cfg.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ValueError(f"{where}: only full-attention DSpark layers are supported (layer_types="
                         f"{sorted(set(layer_types))})")
    fields = block_drafter_fields(cfg, dcfg, where)
    if "block_size" not in dcfg and "block_size" not in cfg:
        raise ValueError(f"{where}: config.json has no 'block_size' (DSpark drafts that many tokens per step)")
    confidence = bool(value("enable_confidence_head", False))
    return DSparkConfig(**fields, markov_rank=rank, confidence_head=confidence,
                        confidence_with_markov=confidence and bool(value("confidence_head_with_markov", False)))


class DSparkDrafter(DFlashDrafter):
    kind = "dspark"

    def __init__(self, cfg: DSparkConfig, target: nn.Module):
        super().__init__(cfg, target)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.markov_w1 = nn.Embedding(cfg.vocab_size, cfg.markov_rank)
        self.markov_w2 = nn.Linear(cfg.markov_rank, cfg.vocab_size, bias=False)
        width = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_with_markov else 0)
        self.confidence = nn.Linear(width, 1) if cfg.confidence_head else None

    @property
    def block_size(self) -> int:
        """The engine's verify block: the anchor and the checkpoint's block_size drafts."""
        return self.config.block_size + 1

    def after_load(self) -> None:
        """Nothing to tie: the embedding and LM head are its own."""

    def session(self, engine, block_size: int):
        return DSparkSession(engine, block_size)

    def forward_hidden(self, block_ids, positions, cache, kv_len: int):
        """block_ids [B, K] (anchor then masks) at `positions` [K] -> final-normed hidden [B, K, H] of
        every row (all draft)."""
        x, delta = self.embed(block_ids), None
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        c = self.config
        mask = attention_mask(positions[-1:].expand(positions.shape[0]), kv_len, c.num_heads // c.num_kv_heads,
                              x.dtype)                                      # non-causal, as DFlash
        for i, layer in enumerate(self.layers):
            _, x, delta = layer(x, delta, cos, sin, positions, cache.k[i], cache.v[i], kv_len, mask)
        _, x = add_rms_norm(x, delta, self.norm.weight, self.norm.eps)
        return x

    def draft(self, hidden, anchor_ids, temperature: float, generator=None):
        """hidden [B, K, H], anchor_ids [B] -> (drafts [B, K], corrected logits [B, K, V],
        confidence [B, K] in (0, 1) or None). The Markov head runs row by row: row k's bias needs the
        token picked at row k - 1."""
        base = linear.linear(self.lm_head, hidden)
        prev, drafts, logits, confidence = anchor_ids, [], [], []
        for k in range(hidden.shape[1]):
            prev_embedding = self.markov_w1(prev)                               # [B, r]
            if self.confidence is not None:
                features = hidden[:, k]
                if self.config.confidence_with_markov:
                    features = torch.cat([features, prev_embedding.to(hidden.dtype)], dim=-1)
                confidence.append(torch.sigmoid(linear.linear(self.confidence, features).float())[:, 0])
            step = base[:, k] + linear.linear(self.markov_w2, prev_embedding)
            if temperature > 0:
                prev = sample_probs(sampling_probs(step, temperature), generator)
            else:
                prev = torch.argmax(step, dim=-1)
            drafts.append(prev)
            logits.append(step)
        return (torch.stack(drafts, dim=1), torch.stack(logits, dim=1),
                torch.stack(confidence, dim=1) if confidence else None)


class DSparkSession:
    """Per-generation state: the target features not yet in the draft cache (as DFlash); the last
    step's confidence per draft (scheduling only)."""
    uses_features = True

    def __init__(self, engine, block_size: int):
        self.engine, self.drafter, self.block_size = engine, engine.drafter, block_size
        self.ctx = self.ctx_start = self.confidence = None

    def begin(self, prompt_ids, first_token: int, features) -> None:
        self.ctx, self.ctx_start = features, 0

    def propose(self, anchor: int, start: int, num_drafts: int, temperature: float, generator):
        d, device = self.drafter, self.ctx.device
        block = torch.full((1, num_drafts), d.mask_token_id, dtype=torch.long, device=device)
        block[0, 0] = anchor
        if temperature > 0:                              # sampled: eager (host generator)
            ctx_positions = torch.arange(self.ctx_start, self.ctx_start + self.ctx.shape[1], device=device)
            positions = torch.arange(start, start + num_drafts, device=device)
            drafts, logits, self.confidence = self._draft(self.ctx, ctx_positions, block, positions,
                                                          start + num_drafts, temperature, generator)
            return drafts, sampling_probs(logits, temperature)
        drafts, self.confidence = block_draft(self.engine, "dspark", self._greedy, self.ctx, self.ctx_start,
                                              block, start, self.block_size - 1)
        return drafts, None

    def _draft(self, ctx, ctx_positions, block, block_positions, kv_len, temperature=0.0, generator=None):
        d, cache = self.drafter, self.engine.draft_cache
        with self.engine.runner.kernel_ctx(block.shape[1]):
            d.write_context(ctx, ctx_positions, cache)
            hidden = d.forward_hidden(block, block_positions, cache, kv_len)
            return d.draft(hidden, block[:, 0], temperature, generator)

    def _greedy(self, ctx, ctx_positions, block, block_positions, kv_len):
        drafts, _, confidence = self._draft(ctx, ctx_positions, block, block_positions, kv_len)
        return drafts, confidence

    def accept(self, new_tokens: list, start: int, features) -> None:
        self.ctx, self.ctx_start = features[:, :len(new_tokens)], start


# -- checkpoint names -------------------------------------------------------------------------------
_OWN = (("embed_tokens.weight", "embed.weight"), ("lm_head.weight", "lm_head.weight"),
        ("markov_head.markov_w1.weight", "markov_w1.weight"), ("markov_head.markov_w2.weight", "markov_w2.weight"))
_CONFIDENCE = (("confidence_head.proj.weight", "confidence.weight"), ("confidence_head.proj.bias", "confidence.bias"))


def dspark_from_hf(hf: dict, cfg: DSparkConfig, where: str) -> dict:
    from .. import hf_names

    hf, ours = dict(hf), {}
    for theirs, mine in _OWN + (_CONFIDENCE if cfg.confidence_head else ()):
        ours[mine] = hf_names.take(hf, theirs, where)
    return {**hf_names.drafter_from_hf(hf, cfg, where), **ours}


def dspark_to_hf(ours: dict, cfg: DSparkConfig) -> dict:
    from .. import hf_names

    pairs = _OWN + (_CONFIDENCE if cfg.confidence_head else ())
    mine = {m for _, m in pairs}
    hf = hf_names.drafter_to_hf({k: v for k, v in ours.items() if k not in mine}, cfg)
    hf.update({theirs: ours[m] for theirs, m in pairs})
    return {k: v.contiguous() for k, v in hf.items()}


def hf_dspark_config(cfg: DSparkConfig, target) -> dict:
    """config.json in the published Qwen3DSparkModel layout (DSpark's keys at the top level)."""
    from ..random_ckpt import _common_hf

    return {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", **_common_hf(cfg),
            "target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
            "block_size": cfg.block_size, "num_anchors": 512, "markov_rank": cfg.markov_rank,
            "markov_head_type": "vanilla", "enable_confidence_head": cfg.confidence_head,
            "confidence_head_with_markov": cfg.confidence_with_markov, "num_target_layers": target.num_layers,
            "tie_word_embeddings": False, "max_position_embeddings": target.max_position_embeddings,
            "layer_types": ["full_attention"] * cfg.num_layers}
