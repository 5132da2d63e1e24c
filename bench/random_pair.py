"""`--target random:<preset>[:<drafter layers>[:<drafter kind>]]`: the scale tier without a checkpoint
on disk. The kind (dflash, dflash2, dspark, pard; default dflash) picks the drafter; the new kinds
take their published scale shapes on 8B presets (models/drafters/random_kinds.py SCALE_SHAPES), e.g.
`random:qwen3-8b:5:dspark`.

Builds our target + DFlash drafter with random weights directly on the device
(`specpilot.models.random_ckpt`, e.g. `random:qwen3-8b` = Qwen3-8B shapes with a 5-layer drafter,
as the public Qwen3-8B DFlash drafter) and a byte-level stand-in tokenizer of the target's vocab
size. Only our methods run on it (HF / stock need a folder: write one with
`random_ckpt.write_pair`). Acceptance of random weights is ~1, so pair it with `--replay`.
"""
import tempfile
from pathlib import Path

PREFIX = "random:"


def is_random(target: str) -> bool:
    return str(target).startswith(PREFIX)


def parse(target: str) -> tuple[str, int]:
    """'random:qwen3-8b[:5]' -> (preset, drafter layers); 5 layers for 8B presets, else 2."""
    from specpilot.models.random_ckpt import TARGET_PRESETS

    parts = str(target)[len(PREFIX):].split(":")
    preset = parts[0]
    if preset not in TARGET_PRESETS or len(parts) > 3:
        raise ValueError(f"--target {target!r}: use random:<preset>[:<drafter layers>[:<drafter kind>]], "
                         f"presets {sorted(TARGET_PRESETS)}")
    kind(target)
    try:
        layers = int(parts[1]) if len(parts) == 2 else (5 if "8b" in preset else 2)
    except ValueError:
        raise ValueError(f"--target {target!r}: drafter layers {parts[1]!r} is not an integer") from None
    return preset, layers


def kind(target: str) -> str:
    """The drafter kind of 'random:<preset>:<layers>:<kind>' (dflash when absent)."""
    from specpilot.models.drafters.kinds import KINDS

    parts = str(target)[len(PREFIX):].split(":")
    name = parts[2] if len(parts) == 3 else "dflash"
    if name not in KINDS:
        raise ValueError(f"--target {target!r}: drafter kind {name!r} is not one of {', '.join(KINDS)}")
    return name


def default_block_size(target: str) -> int:
    """The verify block a random pair runs by default: 16 for DFlash, the published shapes' for the rest."""
    return {"dflash": 16, "dflash2": 8, "dspark": 8, "pard": 13}[kind(target)]


class ByteTokenizer:
    """random_ckpt's byte-level tokenizer (ids 0..255 are bytes; the rest of the vocab is unused
    padding), with no chat template, so prompts go raw. `decode` keeps only the byte tokens: a random
    target's answer is mostly padding ids, which would otherwise decode to `<|unusedN|>` strings ~13
    tokens long each and blow up MT-Bench's second-turn prompt."""

    chat_template = None

    def __init__(self):
        from transformers import AutoTokenizer

        from specpilot.models.random_ckpt import write_byte_tokenizer

        folder = tempfile.mkdtemp(prefix="specpilot_bench_tok_")
        # only the 256 byte ids are ever encoded or decoded, so the smallest vocab will do (fast to
        # build; a 152k-entry one takes ~20 s); a random target gets no stop token anyway
        write_byte_tokenizer(Path(folder), 258)
        self.inner = AutoTokenizer.from_pretrained(folder)
        self.eos_token_id = None

    def encode(self, text, add_special_tokens=False):
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids, skip_special_tokens=True):
        return self.inner.decode([i for i in ids if i < 256], skip_special_tokens=skip_special_tokens)


def tokenizer(target: str) -> ByteTokenizer:
    parse(target)
    return ByteTokenizer()


def engine(target: str, device, dtype, block_size: int, max_seq_len: int, cuda_graphs: bool, with_drafter: bool,
           weights: str = "bf16", options: dict | None = None):
    """Our Engine over a random target (+ drafter) built on `device` (seeds 0 and 1); weights="split12"
    swaps the target's and the drafter's linears as load_target and load_drafter do; options: more
    EngineConfig fields."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models.loading import swap_to_split12
    from specpilot.models.random_ckpt import TARGET_PRESETS, random_target

    preset, layers = parse(target)
    model = random_target(TARGET_PRESETS[preset], device, dtype, seed=0)
    if weights == "split12":
        swap_to_split12(model)
    drafter = random_drafter_of(kind(target), model, layers, block_size) if with_drafter else None
    if weights == "split12" and drafter is not None:
        swap_to_split12(drafter)
    return Engine(model, drafter=drafter, max_seq_len=max_seq_len, config=EngineConfig(cuda_graphs=cuda_graphs, **(options or {})))


def random_drafter_of(kind_name: str, model, layers: int, block_size: int):
    """A random drafter of `kind_name` for the random target `model` (seed 1), on its device and dtype."""
    if kind_name != "dflash":
        from specpilot.models.drafters.random_kinds import random_kind_drafter

        return random_kind_drafter(kind_name, model, layers, block_size, seed=1)
    from specpilot.models.random_ckpt import drafter_config_for, random_drafter

    return random_drafter(drafter_config_for(model.config, layers, block_size), model, seed=1)
