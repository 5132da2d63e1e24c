"""PARD drafter (AMD-AGI/PARD `pard_infer.py`, parallel mode): a separate small causal LM (a plain
Qwen3 / LLaMA checkpoint whose config has `pard_token`) with its own embeddings, LM head and KV cache.

Per step the draft input is [the tokens committed since its last step (ending with the anchor),
pard_token x (K - 1)]: one causal forward on its own cache, the K drafts are the argmax (or samples)
of the last K rows (the anchor's row predicts the first draft, each pard row the next). The pard
rows' K/V are dropped after verification (stock's `cache_mask`; here slot == position, so the next
step's committed tokens overwrite them). The prompt is prefilled into its cache during the
target's prefill. No target features are used (PARD-2's target-feature mode is not supported).

K: `pard_draft_k` in config.json if present (our writer puts it there), else 12 (stock's -k
default); the engine's block is K + 1 (anchor + drafts), and any smaller block drafts its prefix
exactly (the forward is causal).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specpilot.verify.sampling import sample_probs, sampling_probs

from .. import hf_names
from ..config import TargetConfig, target_config_from_dict
from ..target import TargetLM

DEFAULT_DRAFTS = 12


@dataclass(frozen=True)
class PardConfig:
    model: TargetConfig          # the drafter's own causal LM
    pard_token: int
    num_drafts: int = DEFAULT_DRAFTS

    # The engine's draft cache is sized from these (engine/cache.py drafter_cache).
    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self.model.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.model.head_dim


def pard_config_from_dict(cfg: dict, target: TargetConfig, where: str = "drafter") -> PardConfig:
    if cfg.get("pard2") or cfg.get("spd_type") == "pard2":
        raise ValueError(f"{where}: a PARD-2 drafter (target features fused into its input embeddings, "
                         f"warp_model.bin) is not supported yet; plain PARD drafters are")
    model = target_config_from_dict(cfg, where)
    token = cfg.get("pard_token")
    k = int(cfg.get("pard_draft_k", DEFAULT_DRAFTS))
    if model.vocab_size != target.vocab_size:
        raise ValueError(f"{where}: vocab_size {model.vocab_size} != target vocab_size {target.vocab_size} "
                         f"(a PARD drafter must share the target's tokenizer)")
    if not isinstance(token, int) or not 0 <= token < model.vocab_size:
        raise ValueError(f"{where}: pard_token {token!r} must be a token id of the drafter's vocab "
                         f"(size {model.vocab_size})")
    if k < 1:
        raise ValueError(f"{where}: pard_draft_k {k} must be >= 1")
    return PardConfig(model=model, pard_token=token, num_drafts=k)


def pard_from_hf(hf: dict, cfg: PardConfig, where: str) -> dict:
    return {f"model.{k}": v for k, v in hf_names.target_from_hf(hf, cfg.model, where).items()}


def pard_to_hf(ours: dict, cfg: PardConfig) -> dict:
    return hf_names.target_to_hf({k[len("model."):]: v for k, v in ours.items()}, cfg.model)


def hf_pard_config(cfg: PardConfig) -> dict:
    from ..random_ckpt import hf_target_config

    out = hf_target_config(cfg.model, eos_token_id=cfg.model.vocab_size - 2)
    out.update(pard_token=cfg.pard_token, pard_draft_k=cfg.num_drafts)
    return out


class PardDrafter(nn.Module):
    kind = "pard"
    target_layer_ids = ()                 # reads no target features

    def __init__(self, cfg: PardConfig, target: nn.Module):
        super().__init__()
        self.config = cfg
        self.model = TargetLM(cfg.model)
        self._target = [target]           # kept out of this module's parameters

    @property
    def target(self):
        return self._target[0]

    @property
    def block_size(self) -> int:
        return self.config.num_drafts + 1

    @property
    def mask_token_id(self) -> int:
        return self.config.pard_token

    def after_load(self) -> None:
        if self.config.model.tie_word_embeddings:
            self.model.lm_head.weight = self.model.embed.weight

    def ensure_rope(self, num_positions: int, device=None, dtype=None):
        self.model.ensure_rope(num_positions, device, dtype)

    @property
    def rope_cos(self):
        return self.model.rope_cos

    def session(self, engine, block_size: int):
        return PardSession(engine, block_size)

    def forward_tokens(self, ids, first_position: int, cache, logits_rows=None):
        """ids [1, T] at positions first_position.. (causal, own cache) -> logits [1, T or rows, V]."""
        t = ids.shape[1]
        positions = torch.arange(first_position, first_position + t, device=ids.device)
        logits, _ = self.model(ids, positions, cache, first_position + t, (), logits_rows)
        return logits


class PardSession:
    """Per-generation state: the committed tokens not yet in the drafter's cache (ending with the
    anchor), at positions ending at the anchor's.

    Greedy full-size drafts on a graphing engine run as one captured step of fixed shape: the input
    is [pending (p <= K + 1 rows), pard x (2K - p)], 2K rows from position start + 1 - p, its extra
    trailing pard rows past the block (their K/V land at later slots, clamped to the trash slot, which
    every later step overwrites before a real row can see them: slots past the anchor are rewritten
    from the next pending token on); the K draft rows are picked on the device by the offset p - 1.
    Real rows attend exactly as in the eager call (causal: nothing after them is visible)."""
    uses_features = False

    def __init__(self, engine, block_size: int):
        self.engine, self.drafter, self.block_size = engine, engine.drafter, block_size
        self.pending = []

    def begin(self, prompt_ids, first_token: int, features) -> None:
        with self.engine.runner.kernel_ctx(prompt_ids.shape[1]):
            self.drafter.forward_tokens(prompt_ids, 0, self.engine.draft_cache, logits_rows=1)   # own prefill
        self.pending = [first_token]

    def propose(self, anchor: int, start: int, num_drafts: int, temperature: float, generator):
        if temperature == 0 and self.engine.runner.use_graphs and num_drafts == self.block_size - 1:
            return self._graphed(start, num_drafts), None
        d = self.drafter
        ids = torch.tensor([self.pending + [d.mask_token_id] * (num_drafts - 1)], dtype=torch.long,
                           device=self.engine.device)
        with self.engine.runner.kernel_ctx(ids.shape[1]):
            logits = d.forward_tokens(ids, start + 1 - len(self.pending), self.engine.draft_cache,
                                      logits_rows=num_drafts)
        if temperature > 0:
            probs = sampling_probs(logits, temperature)
            return sample_probs(probs, generator), probs
        return torch.argmax(logits, dim=-1), None

    def _graphed(self, start: int, k: int):
        from specpilot.engine.graphs import kv_bucket

        engine, runner, p = self.engine, self.engine.runner, len(self.pending)
        rows, trash = 2 * k, engine.draft_cache.trash_slot
        first = start + 1 - p
        ids = torch.full((1, rows), self.drafter.mask_token_id, dtype=torch.long, device=engine.device)
        ids[0, :p] = torch.tensor(self.pending, dtype=torch.long, device=engine.device)
        positions = (first + torch.arange(rows, device=engine.device)).clamp_(max=trash)
        span = kv_bucket(min(first + rows - 1, trash) + 1, runner.capacity)
        offset = torch.tensor([p - 1], dtype=torch.long, device=engine.device)
        key = ("pard", rows, span)
        if key not in runner.graphs:
            def fn(i, pos, off):
                with runner.kernel_ctx(rows):
                    logits, _ = self.drafter.model(i, pos, engine.draft_cache, span)
                return torch.argmax(logits[0].index_select(0, off + torch.arange(k, device=off.device)), dim=-1)[None]
            runner.graphs[key] = runner.step_factory(fn, (ids, positions, offset), runner.pool)
        return runner.graphs[key](ids, positions, offset)

    def accept(self, new_tokens: list, start: int, features) -> None:
        self.pending = list(new_tokens)
