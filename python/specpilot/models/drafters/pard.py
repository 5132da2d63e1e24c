"""PARD drafter (AMD-AGI/PARD `pard_infer.py`, parallel mode): a separate small causal LM (a plain
Qwen3 / LLaMA checkpoint whose config has `pard_token`) with its own embeddings, LM head and KV cache.

Per step the draft input is [the tokens committed since its last step (ending with the anchor),
pard_token x (K - 1)]: one causal forward on its own cache, the K drafts are the argmax (or samples)
of the last K rows (the anchor's row predicts the first draft, each pard row the next). The pard
rows' K/V are dropped after verification (stock's `cache_mask`; here slot == position, so the next
step's committed tokens overwrite them). The prompt is prefilled into its cache during the
target's prefill. Plain PARD uses no target features.

PARD-2 (`spd_type: pard2` / `pard2: true`, AMD-AGI/PARD `pard2_infer.py`): its input embedding of
each token adds target_proj(f) * scale, f the target's hidden states (layers pard2_target_layers) at
the position before the token (zeros before the first prompt token); the pard rows repeat the last
real row's f. target_proj lives in warp_model.bin (a torch state dict, read with weights_only).

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
    # PARD-2 (target-dependent): target features of these target layers (our feature-layer ids: HF
    # hidden_states[l] is our layer l - 1) fused into the input embeddings as target_proj(f) * scale
    feature_layers: tuple = ()
    feature_dim: int = 0
    feature_scale: float = 0.02
    feature_bias: bool = False

    @property
    def pard2(self) -> bool:
        return bool(self.feature_layers)

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

    @property
    def num_heads(self) -> int:      # the batched engine's graph setup checks the paged kernel fits it
        return self.model.num_heads

    @property
    def vocab_size(self) -> int:     # the target's (checked at load); replayed drafts are drawn from it
        return self.model.vocab_size


def _pard2_fields(cfg: dict, target: TargetConfig, where: str) -> dict:
    """PARD-2's keys (pard2_infer.py's names and fallbacks) -> PardConfig fields; {} for plain PARD."""
    if not (cfg.get("pard2") or cfg.get("spd_type") == "pard2"):
        return {}
    layers = cfg.get("pard2_target_layers")
    if not isinstance(layers, (list, tuple)) or not layers or not all(isinstance(i, int) for i in layers):
        raise ValueError(f"{where}: a PARD-2 config needs pard2_target_layers (a list of ints), got {layers!r}")
    bad = [i for i in layers if not 1 <= i <= target.num_layers]
    if bad:
        raise ValueError(f"{where}: pard2_target_layers {list(layers)} include {bad}: hidden_states indices "
                         f"1..{target.num_layers} (layer outputs) are supported (0, the embeddings, is not)")
    dim = int(cfg.get("pard2_target_dim", cfg.get("pard_target_dim", 4096)))
    if dim != len(layers) * target.hidden_size:
        raise ValueError(f"{where}: pard2_target_dim {dim} != {len(layers)} layers x target hidden_size "
                         f"{target.hidden_size}")
    scale = cfg.get("pard2_scale", cfg.get("pard_scale", cfg.get("feat_scale", 0.02)))
    return dict(feature_layers=tuple(i - 1 for i in layers), feature_dim=dim, feature_scale=float(scale),
                feature_bias=bool(cfg.get("pard2_proj_bias", cfg.get("proj_bias", False))))


def pard_config_from_dict(cfg: dict, target: TargetConfig, where: str = "drafter") -> PardConfig:
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
    return PardConfig(model=model, pard_token=token, num_drafts=k, **_pard2_fields(cfg, target, where))


WARP_FILE = "warp_model.bin"       # PARD-2's target_proj, a torch state dict beside the safetensors


def pard_from_hf(hf: dict, cfg: PardConfig, where: str, folder=None) -> dict:
    ours = {f"model.{k}": v for k, v in hf_names.target_from_hf(hf, cfg.model, where).items()}
    if cfg.pard2:
        ours.update(_read_warp(folder, cfg, where))
    return ours


def _read_warp(folder, cfg: PardConfig, where: str) -> dict:
    from pathlib import Path

    path = Path(folder) / WARP_FILE
    if not path.exists():
        raise FileNotFoundError(f"{where}: a PARD-2 drafter needs {path} (its target_proj)")
    warp = torch.load(str(path), map_location="cpu", weights_only=True)
    names = ["target_proj.weight"] + (["target_proj.bias"] if cfg.feature_bias else [])
    missing = [n for n in names if n not in warp]
    if missing:
        raise ValueError(f"{where}: {path} lacks {missing}")
    return {n: warp[n] for n in names}


def pard_to_hf(ours: dict, cfg: PardConfig) -> dict:
    return hf_names.target_to_hf({k[len("model."):]: v for k, v in ours.items() if k.startswith("model.")}, cfg.model)


def write_warp(ours: dict, folder) -> None:
    """PARD-2's warp_model.bin from our state dict (random checkpoints)."""
    from pathlib import Path

    torch.save({k: v.detach().cpu().contiguous() for k, v in ours.items() if k.startswith("target_proj.")},
               str(Path(folder) / WARP_FILE))


def hf_pard_config(cfg: PardConfig) -> dict:
    from ..random_ckpt import hf_target_config

    out = hf_target_config(cfg.model, eos_token_id=cfg.model.vocab_size - 2)
    out.update(pard_token=cfg.pard_token, pard_draft_k=cfg.num_drafts)
    if cfg.pard2:
        out.update(spd_type="pard2", pard2_target_layers=[i + 1 for i in cfg.feature_layers],
                   pard2_target_dim=cfg.feature_dim, pard2_scale=cfg.feature_scale, pard2_proj_bias=cfg.feature_bias)
    return out


class FusedEmbedding(nn.Embedding):
    """PARD-2's input: the token embedding plus `extra` (target_proj(features) * scale) when set."""
    extra = None

    def forward(self, ids):
        out = super().forward(ids)
        return out if self.extra is None else out + self.extra


class PardDrafter(nn.Module):
    kind = "pard"

    def __init__(self, cfg: PardConfig, target: nn.Module):
        super().__init__()
        self.config = cfg
        self.model = TargetLM(cfg.model)
        if cfg.pard2:
            m = cfg.model
            self.model.embed = FusedEmbedding(m.vocab_size, m.hidden_size)
            if m.tie_word_embeddings:
                self.model.lm_head.weight = self.model.embed.weight
            self.target_proj = nn.Linear(cfg.feature_dim, m.hidden_size, bias=cfg.feature_bias)
        self._target = [target]           # kept out of this module's parameters

    @property
    def target_layer_ids(self) -> tuple:
        """The target layers whose features it reads: none for PARD, PARD-2's for PARD-2."""
        return self.config.feature_layers

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

    def forward_tokens(self, ids, first_position: int, cache, logits_rows=None, features=None):
        """ids [1, T] at positions first_position.. (causal, own cache) -> logits [1, T or rows, V].
        features [1, T, F] (PARD-2): each row's target feature, added as target_proj(f) * scale."""
        t = ids.shape[1]
        positions = torch.arange(first_position, first_position + t, device=ids.device)
        if features is not None:
            fused = self.target_proj(features.to(self.target_proj.weight.dtype))
            self.model.embed.extra = fused * self.config.feature_scale
        try:
            logits, _ = self.model(ids, positions, cache, first_position + t, (), logits_rows)
        finally:
            if features is not None:
                self.model.embed.extra = None
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
    def __init__(self, engine, block_size: int):
        self.engine, self.drafter, self.block_size = engine, engine.drafter, block_size
        self.uses_features = engine.drafter.config.pard2
        self.pending, self.pending_features = [], None

    def begin(self, prompt_ids, first_token: int, features) -> None:
        """Its own prompt prefill. PARD-2: token i gets the target feature of position i - 1 (zeros for
        the first), so the first token's is the prompt's last row."""
        shifted = None
        if self.uses_features:
            shifted = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
            self.pending_features = features[:, -1:]
        with self.engine.runner.kernel_ctx(prompt_ids.shape[1]):
            self.drafter.forward_tokens(prompt_ids, 0, self.engine.draft_cache, logits_rows=1, features=shifted)
        self.pending = [first_token]

    def propose(self, anchor: int, start: int, num_drafts: int, temperature: float, generator):
        if (temperature == 0 and self.engine.runner.use_graphs and num_drafts == self.block_size - 1
                and not self.uses_features):
            return self._graphed(start, num_drafts), None
        d = self.drafter
        ids = torch.tensor([self.pending + [d.mask_token_id] * (num_drafts - 1)], dtype=torch.long,
                           device=self.engine.device)
        features = None
        if self.uses_features:      # the pard rows repeat the last pending row's feature (PARD-2)
            last = self.pending_features[:, -1:]
            features = torch.cat([self.pending_features] + [last] * (num_drafts - 1), dim=1)
        with self.engine.runner.kernel_ctx(ids.shape[1]):
            logits = d.forward_tokens(ids, start + 1 - len(self.pending), self.engine.draft_cache,
                                      logits_rows=num_drafts, features=features)
        if temperature > 0:
            probs = sampling_probs(logits, temperature)
            return sample_probs(probs, generator), probs
        return torch.argmax(logits, dim=-1), None

    def _graphed(self, start: int, k: int):
        engine, runner, p = self.engine, self.engine.runner, len(self.pending)
        rows, trash = 2 * k, engine.draft_cache.trash_slot
        first = start + 1 - p
        ids = torch.full((1, rows), self.drafter.mask_token_id, dtype=torch.long, device=engine.device)
        ids[0, :p] = torch.tensor(self.pending, dtype=torch.long, device=engine.device)
        positions = (first + torch.arange(rows, device=engine.device)).clamp_(max=trash)
        span = runner.kv_span(min(first + rows - 1, trash) + 1)
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
        """new_tokens sit at positions start + 1..; their PARD-2 features are the verify rows of the
        positions before them, rows 0..len - 1."""
        self.pending = list(new_tokens)
        if self.uses_features:
            self.pending_features = features[:, :len(new_tokens)]
