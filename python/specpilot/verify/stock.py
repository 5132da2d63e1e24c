"""Stock: dflash 0.1.0 `dflash_generate` with an HF `AutoModelForCausalLM` target and a
`DFlashDraftModel` (or `DFlash2DraftModel`) drafter (attn_implementation="sdpa"), exactly as dflash's
benchmark loads them. This is the reference every engine output is token-forced against; nothing here
is ours but glue. DSpark and PARD drafters have no installable stock: their reference loops
(verify/dspark_reference.py, verify/pard_reference.py) stand in, greedy only.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from specpilot.models.loading import as_dtype


@dataclass
class StockPair:
    target: torch.nn.Module        # HF causal LM
    drafter: torch.nn.Module       # dflash.model.DFlashDraftModel
    device: torch.device


@dataclass
class StockResult:
    tokens: list                   # new tokens, stop token included
    acceptance_lengths: list
    seconds: float


def load_stock(target_dir, drafter_dir, device="cpu", dtype=torch.bfloat16) -> StockPair:
    from transformers import AutoModelForCausalLM

    from specpilot.formats.split12.io import hf_loadable

    dtype, device = as_dtype(dtype), torch.device(device)
    with hf_loadable(target_dir) as folder:  # a split12 folder: stock reads its bf16 unpack
        target = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
    return StockPair(target.to(device).eval(), _stock_drafter(drafter_dir, dtype, device), device)


def _stock_drafter(drafter_dir, dtype, device):
    """By the drafter's kind: dflash's DFlashDraftModel / DFlash2DraftModel; for DSpark and PARD, which
    have no installable stock, the reference loops beside ours (verify/{dspark,pard}_reference.py)."""
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    from specpilot.models.config import read_config_json
    from specpilot.models.drafters.kinds import detect_kind

    kind = detect_kind(read_config_json(drafter_dir), f"drafter {drafter_dir}")
    if kind == "dspark":
        from .dspark_reference import DSparkReference
        return DSparkReference(drafter_dir, dtype, device)
    if kind == "pard":
        from .pard_reference import PardReference
        return PardReference(drafter_dir, dtype, device)
    cls = DFlash2DraftModel if kind == "dflash2" else DFlashDraftModel
    return cls.from_pretrained(str(drafter_dir), dtype=dtype, attn_implementation="sdpa").to(device).eval()


@contextlib.contextmanager
def _cpu_safe_timer():
    """dflash's stats timer calls torch.cuda.synchronize() unconditionally; on a CPU-only torch that
    raises, so there it is swapped for a plain clock (the generation code is untouched)."""
    import dflash.model as stock

    if torch.cuda.is_available():
        yield
        return
    saved = stock._cuda_time
    stock._cuda_time = time.perf_counter
    try:
        yield
    finally:
        stock._cuda_time = saved


def run_stock(pair: StockPair, prompt_ids, max_new_tokens: int, stop_ids=(), temperature: float = 0.0,
              block_size=None, seed=None) -> StockResult:
    """One `dflash_generate` call; seed (for temperature > 0) is applied with torch.manual_seed."""
    from dflash.model import dflash_generate

    if hasattr(pair.drafter, "generate"):          # the DSpark / PARD reference loops: greedy only
        if temperature > 0:
            raise ValueError(f"the {type(pair.drafter).__name__} loop is greedy only (temperature 0)")
        t0 = time.perf_counter()
        tokens, acceptance = pair.drafter.generate(pair.target, list(map(int, prompt_ids)), max_new_tokens,
                                                   block_size, tuple(stop_ids))
        return StockResult(tokens=tokens, acceptance_lengths=acceptance, seconds=time.perf_counter() - t0)
    ids = torch.tensor([list(map(int, prompt_ids))], dtype=torch.long, device=pair.device)
    if seed is not None:
        torch.manual_seed(int(seed))
    t0 = time.perf_counter()
    with _cpu_safe_timer():
        r = dflash_generate(pair.drafter, pair.target, ids, max_new_tokens, list(stop_ids) or None,
                            temperature, block_size=block_size, return_stats=True)
    seconds = time.perf_counter() - t0
    return StockResult(tokens=r.output_ids[0, ids.shape[1]:].tolist(),
                       acceptance_lengths=list(r.acceptance_lengths), seconds=seconds)


@torch.inference_mode()
def hf_logits(pair: StockPair, sequence) -> torch.Tensor:
    """Stock target's logits [L, V] (fp32) over one full sequence (for near-tie margins)."""
    ids = torch.tensor([list(map(int, sequence))], dtype=torch.long, device=pair.device)
    return pair.target(ids).logits[0].float()
