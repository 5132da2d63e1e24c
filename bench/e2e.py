"""End-to-end runs: every selected method on every prompt of a benchmark -> JSONL rows.

Methods (greedy, the same prompt ids for all):
  hf_ar     stock dflash_generate with block_size=1 (stock's own target-only baseline)
  hf_static HF generate with a static KV cache
  our_ar    Engine.generate_ar
  stock     stock dflash_generate with block_size=B
  our_spec  Engine.generate_spec (with an AcceptanceReplay in the scale tier)
MT-Bench's second turn is asked after the first turn's answer of the reference method (stock when
it runs, as DFlash's harness uses its spec output; else our_spec, our_ar, hf_ar, hf_static), so
every method sees the very same second-turn prompt.
A run over several weight formats (`weights=("bf16", "split12")`) loads one engine per format and
names our methods' rows by format ("our_spec@split12"), so that every format is timed against the
same HF baseline in one process.
"""
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import datasets, hf_baseline, random_pair
from .metrics import base_and_format
from .rows import MethodRun, make_row
from .traces import Trace

METHODS = ("hf_ar", "hf_static", "our_ar", "stock", "our_spec")  # also the run order per prompt
DEFAULT_METHODS = ("hf_ar", "our_ar", "stock", "our_spec")
REFERENCE_ORDER = ("stock", "our_spec", "our_ar", "hf_ar", "hf_static")
WARMUP_TOKENS = 64  # dflash's warm-up length
ANSWER_ROOM = 2     # a turn's answer carried into the next turn re-encodes to <= this x max_new_tokens


@dataclass
class BenchConfig:
    target_dir: str
    drafter_dir: str | None
    device: torch.device
    dtype: torch.dtype
    max_new_tokens: int = 2048
    block_size: int | None = None          # None: the drafter's own
    methods: tuple[str, ...] = DEFAULT_METHODS
    replay: Trace | None = None            # scale tier: replay this acceptance trace in our_spec
    weights: tuple[str, ...] = ("bf16",)   # our engine's weight formats (bf16 | split12), one engine each
    max_seq_len: int = 4096
    cuda_graphs: bool = True
    engine_options: dict = field(default_factory=dict)   # more EngineConfig fields (two_level, draft_vocab, ...)


def parse_methods(text: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise ValueError(f"unknown method(s) {bad or text!r}; choose from {','.join(METHODS)}")
    return tuple(m for m in METHODS if m in names)


def stop_ids_for(target_dir, tokenizer) -> list[int]:
    """The target's generation_config eos ids, else the tokenizer's eos (dflash's stop_token_ids)."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(target_dir).eos_token_id
    except OSError:
        eos = None
    eos = eos if eos is not None else tokenizer.eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def _from_engine(r, spec: bool, replayed: bool = False) -> MethodRun:
    return MethodRun(tokens=list(r.tokens), prefill_s=float(r.prefill_s), decode_s=float(r.decode_s),
                     acceptance_lengths=list(r.acceptance_lengths) if spec else None,
                     replay_shortfalls=int(getattr(r, "replay_shortfalls", 0)) if replayed else None)


@dataclass
class Runners:
    """name -> fn(prompt_ids, max_new_tokens, prompt_index, transcript) -> MethodRun.
    `transcript` is the target's greedy tokens for that prompt (our_ar's), used only by replay;
    `ar_for_transcript[name]` makes it for a spec method whose AR twin did not run."""
    fns: dict[str, Callable] = field(default_factory=dict)
    block_size: int = 1
    needs_transcript: bool = False
    ar_for_transcript: dict[str, Callable] = field(default_factory=dict)


def our_method(base: str, weights: str, formats: tuple[str, ...]) -> str:
    """The row name of one of our methods: "our_spec", or "our_spec@split12" when a run compares
    several weight formats."""
    return base if len(formats) == 1 else f"{base}@{weights}"


def build_runners(cfg: BenchConfig, stop_ids: list[int]) -> Runners:
    """Load what the chosen methods need: the HF pair, and one engine per weight format."""
    wants_hf = any(m in cfg.methods for m in ("hf_ar", "hf_static", "stock"))
    wants_ours = any(m in cfg.methods for m in ("our_ar", "our_spec"))
    wants_drafter = any(m in cfg.methods for m in ("stock", "our_spec"))
    if random_pair.is_random(cfg.target_dir) and wants_hf:
        raise ValueError(f"--target {cfg.target_dir} builds our models only; hf_ar/hf_static/stock need a "
                         "checkpoint folder (specpilot.models.random_ckpt.write_pair writes one)")
    if (cfg.drafter_dir is None and not random_pair.is_random(cfg.target_dir)
            and (wants_drafter or "hf_ar" in cfg.methods)):
        raise ValueError(f"methods {cfg.methods} need --drafter (hf_ar is dflash_generate at block 1, "
                         "which takes the drafter object)")
    hf_pair = None
    if wants_hf:  # dflash_generate needs the drafter object even at block_size=1
        needs_hf_drafter = any(m in cfg.methods for m in ("hf_ar", "stock"))
        hf_pair = hf_baseline.load_hf_pair(cfg.target_dir, cfg.drafter_dir if needs_hf_drafter else None,
                                           cfg.device, cfg.dtype)
    engines = {w: load_engine(cfg, w, with_drafter=wants_drafter) for w in cfg.weights} if wants_ours else {}
    block_size = cfg.block_size or _drafter_block_size(hf_pair, next(iter(engines.values()), None), wants_drafter)
    if cfg.replay is not None and block_size < cfg.replay.block_size:
        raise ValueError(f"replayed trace has block size {cfg.replay.block_size} > run block size {block_size}")

    run = Runners(block_size=block_size, needs_transcript=cfg.replay is not None and "our_spec" in cfg.methods)
    hf = {
        "hf_ar": lambda ids, n, i, t: hf_baseline.run_dflash(hf_pair, ids, n, stop_ids, 1),
        "hf_static": lambda ids, n, i, t: hf_baseline.run_hf_static(hf_pair, ids, n, stop_ids),
        "stock": lambda ids, n, i, t: hf_baseline.run_dflash(hf_pair, ids, n, stop_ids, block_size),
    }
    for m in cfg.methods:  # METHODS order, each of ours once per format
        if m in hf:
            run.fns[m] = hf[m]
            continue
        for w, engine in engines.items():
            run.fns[our_method(m, w, cfg.weights)] = _engine_fn(m, engine, stop_ids, block_size, cfg.replay)
    for w, engine in engines.items():
        run.ar_for_transcript[our_method("our_spec", w, cfg.weights)] = _engine_fn("our_ar", engine, stop_ids, 1, None)
    return run


def _engine_fn(method: str, engine, stop_ids, block_size: int, replay: Trace | None) -> Callable:
    stops = tuple(stop_ids)
    if method == "our_ar":
        return lambda ids, n, i, t: _from_engine(engine.generate_ar(ids, n, stop_ids=stops), False)
    return lambda ids, n, i, t: _from_engine(engine.generate_spec(
        ids, n, stop_ids=stops, block_size=block_size, replay=_replay(replay, i, t, n)), True, replay is not None)


def _replay(trace: Trace | None, index: int, transcript, max_new_tokens: int):
    if trace is None:
        return None
    from specpilot.engine.replay import AcceptanceReplay

    return AcceptanceReplay(transcript, trace.steps_for(index, max_new_tokens))


def drafter_block_size(drafter_dir) -> int:
    """The drafter's trained block size (dflash_config.block_size, else config.block_size); for the
    other kinds their verify block (models/drafters/kinds.py verify_block_size)."""
    import json
    from pathlib import Path

    path = Path(drafter_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"drafter config {path} does not exist")
    config = json.loads(path.read_text())
    from specpilot.models.drafters.kinds import detect_kind, verify_block_size

    kind = detect_kind(config, f"drafter {drafter_dir}")
    if kind != "dflash":
        return verify_block_size(kind, config)
    bs = (config.get("dflash_config") or {}).get("block_size", config.get("block_size"))
    if not isinstance(bs, int) or bs < 2:
        raise ValueError(f"{path}: no usable block_size (got {bs!r}); pass --block-size")
    return bs


def _drafter_block_size(hf_pair, engine, wants_drafter) -> int:
    if not wants_drafter:
        return 1
    for owner in (getattr(hf_pair, "drafter", None), getattr(engine, "drafter", None)):
        bs = getattr(owner, "block_size", None)
        if bs:
            return int(bs)
    raise RuntimeError("could not read the drafter's block size; pass --block-size")


def load_engine(cfg: BenchConfig, weights: str, with_drafter: bool):
    if random_pair.is_random(cfg.target_dir):
        return random_pair.engine(cfg.target_dir, cfg.device, cfg.dtype, cfg.block_size or 16,
                                  cfg.max_seq_len, cfg.cuda_graphs, with_drafter, weights, cfg.engine_options)
    try:
        from specpilot.config import EngineConfig
        from specpilot.engine import Engine
        from specpilot.models import load_drafter, load_target
    except ImportError as e:
        raise RuntimeError(f"our engine is not importable ({e}); run only --methods hf_ar,hf_static,stock") from e
    target = load_target(cfg.target_dir, device=str(cfg.device), dtype=cfg.dtype, weights=weights)
    drafter = load_drafter(cfg.drafter_dir, target) if with_drafter else None
    config = EngineConfig(cuda_graphs=cfg.cuda_graphs, **cfg.engine_options)
    return Engine(target, drafter=drafter, max_seq_len=cfg.max_seq_len, config=config)


# ---- the loop ------------------------------------------------------------------------------------

def warm_up(runners: Runners, prompt_ids: list[int], max_new_tokens: int) -> None:
    """One untimed short call of every method (kernels, allocator, CUDA graphs, lazy inits)."""
    n = min(WARMUP_TOKENS, max_new_tokens)
    for name, fn in runners.fns.items():
        fn(prompt_ids, n, 0, _transcript(runners, name, {}, prompt_ids, n))


def fastest_of(fn, repeats: int, *args) -> MethodRun:
    """`repeats` timed calls, the one with the least decode time kept (a shared or noisy host only
    ever slows a run down). Greedy outputs should not change between calls: a change is reported on
    stderr (non-deterministic kernels flipping a near-tie), not fatal to a long run."""
    best = None
    for _ in range(repeats):
        run = fn(*args)
        if best is not None and run.tokens != best.tokens:
            print(f"specpilot bench: warning: output changed between repeats of one prompt "
                  f"({len(best.tokens)} vs {len(run.tokens)} tokens); keeping the fastest", file=sys.stderr)
        if best is None or run.decode_s < best.decode_s:
            best = run
    return best


def run_benchmark(name: str, samples: list[datasets.Sample], tokenizer, runners: Runners,
                  max_new_tokens: int, progress=None, repeats: int = 1, rows: list | None = None) -> list[dict]:
    """Every method on every turn of every sample; one row per (sample, turn, method), appended to
    `rows` (a new list if None) as each prompt finishes, so a caller keeps them if a later one fails."""
    rows, index = ([] if rows is None else rows), 0
    for k, sample in enumerate(samples):
        messages = []
        for turn, text in enumerate(sample.turns):
            messages.append({"role": "user", "content": text})
            ids = datasets.encode(tokenizer, messages)
            outs = {}
            for m, fn in runners.fns.items():
                transcript = _transcript(runners, m, outs, ids, max_new_tokens)
                outs[m] = fastest_of(fn, repeats, ids, max_new_tokens, index, transcript)
            for m, out in outs.items():
                rows.append(make_row(name, sample.id, turn, index, m, len(ids), out))
            if progress:
                progress(name, k + 1, len(samples), turn, rows)
            if turn + 1 < len(sample.turns):
                ref = next(m for base in REFERENCE_ORDER for m in outs if base_and_format(m)[0] == base)
                answer = carried_answer(tokenizer, outs[ref].tokens, max_new_tokens, f"{name} {sample.id}")
                messages.append({"role": "assistant", "content": answer})
            index += 1
    return rows


def carried_answer(tokenizer, tokens, max_new_tokens: int, where: str = "") -> str:
    """The text of a turn's answer, which the next turn is asked after (decoded, as DFlash's harness
    does). A trained model's text re-encodes to about as many tokens; a random-weight target's can
    re-encode to ~15x as many (broken multi-byte pieces), so the text is cut to the room the KV
    caches were sized for (ANSWER_ROOM x max_new_tokens tokens), with a note on stderr."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    room = ANSWER_ROOM * max_new_tokens
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= room:
        return text
    keep = room
    while len(tokenizer.encode(cut := tokenizer.decode(ids[:keep], skip_special_tokens=True),
                               add_special_tokens=False)) > room:
        keep = max(0, keep - 8)  # a cut inside a multi-byte character can re-encode longer
    print(f"specpilot bench: {where}: the answer re-encodes to {len(ids)} tokens, cut to {keep} "
          f"for the next turn", file=sys.stderr, flush=True)
    return cut


def _transcript(runners: Runners, method: str, outs: dict, ids, max_new_tokens):
    """Replay only: the target's greedy tokens for this prompt, from the same weight format (its
    our_ar's if that ran, else an untimed generate_ar)."""
    if base_and_format(method)[0] != "our_spec" or not runners.needs_transcript:
        return None
    twin = method.replace("our_spec", "our_ar", 1)
    if twin in outs:
        return outs[twin].tokens
    return list(runners.ar_for_transcript[method](ids, max_new_tokens, 0, None).tokens)


def running_summary(name, rows) -> str:
    """Running tau and tok/s of each method on benchmark `name`: "our_spec tau 4.10 90.1 tok/s | ..."."""
    from .metrics import method_summary

    mine = [r for r in rows if r["benchmark"] == name]
    parts = []
    for m in dict.fromkeys(r["method"] for r in mine):
        s = method_summary([r for r in mine if r["method"] == m])
        tau = f" tau {s['tau']:.2f}" if s["tau"] is not None else ""
        parts.append(f"{m}{tau} {s['tokens_per_s']:.1f} tok/s")
    return " | ".join(parts)


def print_progress(name, k, n, turn, rows, stream=None):
    """One stderr line per prompt: running tau and tok/s of each method on this benchmark."""
    turn_note = f" turn {turn + 1}" if turn else ""
    print(f"[{name} {k}/{n}{turn_note}] " + running_summary(name, rows), file=stream or sys.stderr, flush=True)
