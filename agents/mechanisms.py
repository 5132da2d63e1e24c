"""The mechanism registry: every engine switch and knob the agent loop may search, with its candidate
values, the cost-model family it acts on, and the deployments it applies to.

One source of truth: the EngineConfig / BatchConfig fields themselves (read with dataclasses.fields,
validated by constructing the dataclass with each candidate value) plus the small tables below that
say what the fields cannot: candidate values of integer knobs, the family, where a field applies, and
why a field is not searched. tests/test_agents_mechanisms.py fails when a field is added to either
config without an entry here.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from specpilot.config import ATTENTION_CHOICES, TWO_LEVEL_CHOICES, EngineConfig
from specpilot.engine.batch.config import BatchConfig

# Where a mechanism applies (Deployment.supports): all | cuda (a kernel or graph that the CPU never
# runs) | drafter (speculative decoding) | batched (concurrency > 1: the batched engine) | split12
# (the deployment stores split12 weights, which decode losslessly to bf16; bf16 cannot become split12
# without a pack step).
SCOPES = ("all", "cuda", "drafter", "batched", "split12")

# Cost-model families (cost/gaps.py rows: step and kind) a mechanism acts on: the loop tries the
# mechanisms of the family with the most time lost per token first.
FAMILIES = ("launches", "decode.linear", "spec.linear", "attention", "draft.lm_head", "verify.lm_head",
            "spec.knob", "weights")

# field -> (family, scope, candidate values or None for the field's own choices / True-False)
ENGINE_TABLE = {
    "cuda_graphs": ("launches", "cuda", None),
    "compile_layers": ("launches", "cuda", None),
    "fused_steps": ("launches", "drafter", None),
    "early_launch": ("launches", "cuda", None),
    "step_kernels": ("launches", "cuda", None),
    "fused_kernels": ("launches", "cuda", None),
    "fused_gemv": ("decode.linear", "cuda", None),
    "gemv_pdl": ("decode.linear", "cuda", None),
    "skinny_gemm": ("spec.linear", "cuda", None),
    "split12_decode_grid": ("spec.linear", "split12", None),
    "attention": ("attention", "cuda", None),
    "attention_fused_rope": ("attention", "cuda", None),
    "attention_pdl": ("attention", "cuda", None),
    "graph_kv_step": ("attention", "cuda", (0, 256, 512)),     # the graphed attention reads its whole span
    "draft_vocab": ("draft.lm_head", "drafter", (0, 4096, 16384, 32768)),
    "two_level": ("verify.lm_head", "drafter", None),
    "tree_budget": ("spec.knob", "drafter", (0, 8, 16, 32)),
}
BATCH_TABLE = {
    "ragged_verify": ("spec.linear", "batched", None),
    "batched_draft": ("spec.linear", "batched", None),
    "adaptive_verify": ("spec.linear", "batched", None),
    "verify_prefix": ("spec.linear", "batched", (0, 2, 3)),     # prefix-first; below every block size searched
    "page_size": ("attention", "batched", (16, 32, 64)),
    "prefill_chunk": ("launches", "batched", (128, 256, 512, 2048)),   # prefill is compute-bound: fewer, larger chunks
}
# Knobs of a run that are not config fields: generate_spec(block_size=...), load_target(weights=...) and
# which drafter of the deployment's candidates loads (an index: the candidates are the deployment's own).
MAX_DRAFTERS = 4
RUN_TABLE = {
    "block_size": ("spec.knob", "drafter", (None, 4, 8, 12, 16), None,
                   "Tokens drafted and verified per speculative step (None: the drafter's own block; at most it)."),
    "weights": ("weights", "split12", ("bf16", "split12"), "split12",
                "The target's weight format: split12 streams 1.5 bytes per weight, bf16 two."),
    "drafter": ("spec.knob", "drafter", tuple(range(MAX_DRAFTERS)), 0,
                "Which of the deployment's drafters drafts (its index in the --drafter list; searched where "
                "several fit the target)."),
}
# Fields deliberately not searched, with the reason (a new field must land in a table or here).
NOT_SEARCHED = {
    "EngineConfig.variants_manifest": "written by the kernel search's integration, not a choice",
    "EngineConfig.draft_vocab_ranking": "a path to the ranking draft_vocab uses, not a speed choice",
    "BatchConfig.adaptive_probe_every": "a tuning constant of adaptive_verify, not a mechanism",
    "BatchConfig.cost_ridge_tokens": "a stand-in for a profiled step-cost table, not a mechanism",
}
# Choices that exist as values but are refused by the config (prefix-first: the batched engine's
# BatchConfig.verify_prefix, refused by EngineConfig).
UNBUILT = {("two_level", "prefix-first")}
_CHOICES = {"attention": ATTENTION_CHOICES, "two_level": TWO_LEVEL_CHOICES}


@dataclass(frozen=True)
class Mechanism:
    name: str          # "engine.<field>", "batch.<field>" or "run.<knob>"
    owner: str         # EngineConfig | BatchConfig | run
    field: str
    values: tuple      # candidate values, the default among them
    default: object    # the shipped (hand-tuned) value
    family: str
    scope: str
    doc: str

    def line(self) -> str:
        vals = ", ".join(("*" if v == self.default else "") + str(v) for v in self.values)
        return f"{self.name:<30} [{vals}]  family={self.family} scope={self.scope}  {self.doc}"


def _values(name: str, kind, table_values) -> tuple:
    if table_values is not None:
        return tuple(table_values)
    if kind in ("bool", bool):
        return (True, False)
    if name in _CHOICES:
        return tuple(v for v in _CHOICES[name] if (name, v) not in UNBUILT)
    raise ValueError(f"mechanism {name!r}: no candidate values (add them to the table in agents/mechanisms.py)")


def _from_config(cls, table: dict, prefix: str) -> list:
    docs = _field_docs(cls)
    out = []
    for f in fields(cls):
        if f.name not in table:
            if f"{cls.__name__}.{f.name}" not in NOT_SEARCHED:
                raise ValueError(f"{cls.__name__}.{f.name} is neither searched nor in NOT_SEARCHED "
                                 f"(agents/mechanisms.py)")
            continue
        family, scope, table_values = table[f.name]
        values = _values(f.name, f.type, table_values)
        default = f.default if f.default is not MISSING else None
        if default not in values:
            values = (default, *values)
        for v in values:  # every candidate must be a valid config value
            cls(**{f.name: v})
        out.append(Mechanism(f"{prefix}.{f.name}", cls.__name__, f.name, values, default, family, scope,
                             docs.get(f.name, "").split(". ")[0].rstrip(".") + "."))
    return out


def _field_docs(cls) -> dict:
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def registry() -> list:
    """Every searchable mechanism, EngineConfig fields first, then BatchConfig's, then the run knobs."""
    unknown = [k for k in NOT_SEARCHED if k.split(".")[1] in {**ENGINE_TABLE, **BATCH_TABLE}]
    if unknown:
        raise ValueError(f"{unknown} are both searched and listed as not searched")
    out = _from_config(EngineConfig, ENGINE_TABLE, "engine") + _from_config(BatchConfig, BATCH_TABLE, "batch")
    for name, (family, scope, values, default, doc) in RUN_TABLE.items():
        out.append(Mechanism(f"run.{name}", "run", name, values, default, family, scope, doc))
    for m in out:
        if m.family not in FAMILIES or m.scope not in SCOPES:
            raise ValueError(f"mechanism {m.name}: family {m.family!r} / scope {m.scope!r} unknown")
    return out


def by_name() -> dict:
    return {m.name: m for m in registry()}


def list_lines() -> list:
    """`specpilot optimize --list-mechanisms`: one mechanism per line (* marks the shipped default)."""
    return [m.line() for m in registry()]


def configs_for(assignment: dict, weights: str) -> tuple:
    """{mechanism name: value} -> (EngineConfig, BatchConfig, run knobs {"block_size", "weights", "drafter"}).
    Mechanisms not named keep the shipped default (the weights: the deployment's `weights`); an
    unknown name or a value outside the candidate list is an error naming it."""
    known = by_name()
    engine, batch, run = {}, {}, {}
    for name, value in assignment.items():
        if name not in known:
            raise ValueError(f"unknown mechanism {name!r}; known: {sorted(known)}")
        m = known[name]
        if value not in m.values:
            raise ValueError(f"mechanism {name}: value {value!r} is not one of {m.values}")
        {"EngineConfig": engine, "BatchConfig": batch, "run": run}[m.owner][m.field] = value
    run.setdefault("block_size", None)
    run.setdefault("weights", weights)
    run.setdefault("drafter", 0)
    return EngineConfig(**engine), BatchConfig(**batch), run


def plainest(mechanisms) -> dict:
    """The de-tuned start: every switch off, every choice at its plainest (the first non-default
    value for choices: sdpa attention, bf16 weights, the full draft head, no two-level, block as is,
    the first drafter)."""
    plain = {}
    for m in mechanisms:
        if m.values == (True, False):
            plain[m.name] = False
        elif m.name == "engine.attention":
            plain[m.name] = "sdpa"
        elif m.name == "run.weights":
            plain[m.name] = "bf16"
        else:
            plain[m.name] = m.default  # integer knobs and modes: the shipped value is the plain one
    return plain
