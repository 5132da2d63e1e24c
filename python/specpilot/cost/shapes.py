"""The work of one decode / draft / verify step, from the checkpoints' config.json files.

Every GEMM is listed by shape (M rows of activations, N out features, K in features) with how many
times a step runs it; attention by the KV bytes it must read; acceptance by the logits it scans.
"""
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Component:
    step: str        # decode | draft | verify
    name: str        # qkv, o, gate_up, down, lm_head, fc, draft.qkv, ..., attention, accept, launches
    kind: str        # linear | attention | recurrent (a hybrid's GDN state) | accept | launches
    m: int = 0
    n: int = 0
    k: int = 0
    count: float = 1  # instances per step (an expected count for a conditional component)
    extra: tuple = ()  # kind-specific: attention (kv_bytes,), recurrent (state bytes,), launches (kernels not timed as components,)


@dataclass(frozen=True)
class Recurrent:
    """A hybrid target's Gated DeltaNet layers (Qwen3.5 / Qwen3-Next): their count and head shapes."""
    layers: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    @property
    def state_bytes(self) -> int:
        """One request's fp32 delta-rule state of one layer [value heads, Dk, Dv]."""
        return self.value_heads * self.key_dim * self.value_dim * 4


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    name: str
    recurrent: Recurrent | None = None    # hybrid targets: the GDN layers among `layers`
    gated_attention: bool = False         # q_proj also produces the output gate (Qwen3.5 / Qwen3-Next)

    @staticmethod
    def from_dir(path) -> "ModelShape":
        cfg_path = Path(path) / "config.json"
        if not cfg_path.exists():
            raise FileNotFoundError(f"no config.json in {path}")
        c = json.loads(cfg_path.read_text())
        c = c.get("text_config", c) if "hidden_size" not in c else c      # Qwen3_5ForConditionalGeneration
        try:
            h, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
            recurrent, gated = None, False
            if "linear_attention" in c.get("layer_types", ()):
                recurrent = Recurrent(c["layer_types"].count("linear_attention"), int(c["linear_num_key_heads"]),
                                      int(c["linear_num_value_heads"]), int(c["linear_key_head_dim"]),
                                      int(c["linear_value_head_dim"]))
                gated = bool(c.get("attn_output_gate", True))
            return ModelShape(h, heads, int(c.get("num_key_value_heads", heads)), int(c.get("head_dim", h // heads)),
                              int(c["intermediate_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"]),
                              Path(path).resolve().name, recurrent, gated)
        except KeyError as e:
            raise ValueError(f"{cfg_path}: missing {e.args[0]} (need a Qwen3 / LLaMA / Qwen3.5-style config)") from None

    @property
    def attention_layers(self) -> int:
        return self.layers - (self.recurrent.layers if self.recurrent else 0)

    def gemms(self, m: int, prefix: str = ""):
        """(name, M, N, K, layers that run it) of every linear in a layer stack at m rows."""
        q = self.heads * self.head_dim * (2 if self.gated_attention else 1)
        out = [(prefix + "qkv", m, q + 2 * self.kv_heads * self.head_dim, self.hidden, self.attention_layers),
               (prefix + "o", m, self.hidden, self.heads * self.head_dim, self.attention_layers)]
        r = self.recurrent
        if r is not None:     # in_proj_qkvz + in_proj_ba as one row block, out_proj
            qkvz = 2 * r.key_heads * r.key_dim + 2 * r.value_heads * r.value_dim
            out += [(prefix + "gdn.in_proj", m, qkvz + 2 * r.value_heads, self.hidden, r.layers),
                    (prefix + "gdn.out_proj", m, self.hidden, r.value_heads * r.value_dim, r.layers)]
        return out + [(prefix + "gate_up", m, 2 * self.intermediate, self.hidden, self.layers),
                      (prefix + "down", m, self.hidden, self.intermediate, self.layers)]

    def kv_bytes(self, batch: int, context: int, elem: int = 2) -> int:
        return batch * context * 2 * self.kv_heads * self.head_dim * elem  # K and V of one layer

    def recurrent_bytes(self, batch: int, rows: int) -> int:
        """One GDN layer's state traffic for `rows` rows over `batch` requests: each request's state
        read once, and a state written per row (the per-row snapshots a verify keeps; a decode row's
        new state)."""
        return (batch + rows) * self.recurrent.state_bytes


def drafter_target_layers(drafter_dir) -> int:
    c = json.loads((Path(drafter_dir) / "config.json").read_text())
    ids = (c.get("dflash_config") or {}).get("target_layer_ids") or c.get("target_layer_ids") or []
    return max(1, len(ids))


# The kernels a graphed step runs besides the components listed here (norms, q/k norm + rope, the
# SwiGLU gate, the embedding and position gathers): (per layer, per step), from the kernels that
# bench/kernel_counts.py counted on the engine's defaults (H100, session 22) less those
# the components stand for: a layer's linears and its attention's split + combine kernels; the
# drafter's "qkv" is its q and block-K/V kernels. The bf16 one-token GEMVs carry the norms and the
# gate inside; the split12 one-token path runs them as kernels of their own. The CPU engine runs
# eager torch ops, more of them: there this is a floor.
UNTIMED_KERNELS = {("decode", "bf16"): (0, 4), ("decode", "split12"): (3, 5),
                   ("verify", "bf16"): (4, 6), ("verify", "split12"): (4, 6),
                   ("draft", "bf16"): (5, 16), ("draft", "split12"): (5, 16)}


SHORTLIST = 8    # the certified head's draft top-k per verify row (engine/certified_head.py TOP_K)


def untimed_kernels(step: str, weights: str, layers: int) -> int:
    per_layer, per_step = UNTIMED_KERNELS[(step, weights)]
    return per_layer * layers + per_step


def step_components(target: ModelShape, drafter: ModelShape | None, n_target_feats: int, batch: int,
                    block_size: int, context: int, weights: str = "bf16", draft_vocab: int = 0,
                    certified: tuple | None = None, prefill_rows: int = 0) -> list:
    """Components of an AR decode step, and with a drafter, of a draft and a verify step.

    prefill_rows P > 0: a newcomer's prompt chunk rides in the decode and verify forwards (the batched
    engine's mixed step): P more rows through every linear and attention layer (attending over
    `context` keys, as the decode rows), and LM-head rows only at each PREFILL_TILE-row tile's last.

    draft_vocab N > 0 (EngineConfig.draft_vocab): the draft LM head has N rows, plus the expansion of
    its logits to a full -inf row (an `accept`-kind scan of the vocabulary). certified = (rank r,
    fallback rate f) (EngineConfig.two_level "certified-head"): the verify LM head becomes level 1
    (an r-column GEMM over every row, the shortlisted rows read exactly) plus the exact head in the
    fraction f of steps that need it (count f)."""
    out = []

    def layers(step, shape, m, prefix=""):
        for name, mm, n, k, count in shape.gemms(m, prefix):
            out.append(Component(step, name, "linear", mm, n, k, count))
        out.append(Component(step, prefix + "attention", "attention", m, count=shape.attention_layers,
                             extra=(shape.kv_bytes(batch, context),)))
        if shape.recurrent is not None:
            out.append(Component(step, prefix + "gdn", "recurrent", m, count=shape.recurrent.layers,
                                 extra=(shape.recurrent_bytes(batch, m),)))

    tile_heads = 0
    if prefill_rows:
        from specpilot.engine.batch.graphed import PREFILL_TILE

        tile_heads = -(-prefill_rows // PREFILL_TILE)
    layers("decode", target, batch + prefill_rows)
    out.append(Component("decode", "lm_head", "linear", batch + tile_heads, target.vocab, target.hidden))
    out.append(Component("decode", "sample", "accept", batch, target.vocab))
    out.append(Component("decode", "launches", "launches", extra=(untimed_kernels("decode", weights, target.layers),)))
    if drafter is None:
        return out
    mb = batch * block_size
    # The graphed draft step pads the newly committed context rows to the block (engine/steps.py
    # draft_step): fc and each layer's context K/V projection run at mb rows.
    out.append(Component("draft", "fc", "linear", mb, drafter.hidden, n_target_feats * target.hidden))
    out.append(Component("draft", "draft.ctx_kv", "linear", mb, 2 * drafter.kv_heads * drafter.head_dim,
                         drafter.hidden, drafter.layers))
    layers("draft", drafter, mb, "draft.")
    draft_rows = batch * (block_size - 1)
    out.append(Component("draft", "draft.lm_head", "linear", draft_rows, draft_vocab or target.vocab, target.hidden))
    if draft_vocab:
        out.append(Component("draft", "draft.vocab_expand", "accept", draft_rows, target.vocab))
    out.append(Component("draft", "launches", "launches", extra=(untimed_kernels("draft", weights, drafter.layers),)))
    layers("verify", target, mb + prefill_rows)
    if certified is None:
        out.append(Component("verify", "lm_head", "linear", mb + tile_heads, target.vocab, target.hidden))
    else:
        rank, fallback_rate = certified
        out.append(Component("verify", "lm_head.level1", "linear", mb, target.vocab, rank))
        out.append(Component("verify", "lm_head.shortlist", "linear", mb, mb * (SHORTLIST + 1), target.hidden))
        out.append(Component("verify", "lm_head.fallback", "linear", mb, target.vocab, target.hidden,
                             count=fallback_rate))
    out.append(Component("verify", "accept", "accept", mb, target.vocab))
    out.append(Component("verify", "launches", "launches", extra=(untimed_kernels("verify", weights, target.layers),)))
    return out
