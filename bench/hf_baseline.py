"""The Hugging Face side of the benchmark: stock DFlash and HF autoregressive baselines.

- `hf_ar`:     `dflash_generate(..., block_size=1)`, stock DFlash's own target-only baseline (the
               denominator of the "Decoding speedup" dflash's benchmark prints).
- `hf_static`: HF `generate` (greedy) with a static KV cache sized per prompt (HF auto-compiles its
               decode step on CUDA, once per cache length, untimed).
- `stock`:     `dflash_generate(..., block_size=B)`, the reference speculative loop.
All greedy. Outputs are whatever HF/dflash produce (no exactness claim here: these are the
references that ours is compared with).
"""
import time
from dataclasses import dataclass, field

import torch

from . import timing
from .rows import MethodRun


STATIC_CACHE_BUCKET = 512  # hf_static's cache length is the prompt's need rounded up to this
STATIC_WARMUP_TOKENS = 64   # an untimed call on each new cache length (HF recompiles its decode step)


@dataclass
class HFPair:
    target: torch.nn.Module
    drafter: torch.nn.Module | None
    device: torch.device
    static_caches: dict = field(default_factory=dict)  # hf_static: cache length -> StaticCache

    def static_cache_for(self, needed: int):
        """A reset StaticCache with room for `needed` positions, and whether it is new. HF's static
        cache attends over every slot at every step, so one run-wide length (sized for MT-Bench's
        second turn) would slow every shorter prompt down; lengths rounded up to STATIC_CACHE_BUCKET
        keep the baseline close to what each prompt needs. A new length makes HF compile its decode
        step again (static caches trigger torch.compile on CUDA): the caller warms it up untimed."""
        from transformers import StaticCache

        length = -(-needed // STATIC_CACHE_BUCKET) * STATIC_CACHE_BUCKET
        cache = self.static_caches.get(length)
        if cache is None:
            cache = self.static_caches[length] = StaticCache(config=self.target.config, max_cache_len=length)
            return cache, True
        with torch.inference_mode():  # its tensors were made under inference mode by generate
            cache.reset()
        return cache, False


def load_hf_pair(target_dir, drafter_dir, device, dtype) -> HFPair:
    """Target and drafter loaded as dflash.benchmark.load_transformers_models does (SDPA), with
    the run's device and dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specpilot.formats.split12.io import hf_loadable

    with hf_loadable(target_dir) as folder:  # a split12 folder: HF reads its bf16 unpack
        target = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
    target = target.to(device).eval()
    drafter = None
    if drafter_dir is not None:
        from dflash.model import DFlash2DraftModel, DFlashDraftModel

        from specpilot.models.config import read_config_json
        from specpilot.models.drafters.kinds import detect_kind

        kind = detect_kind(read_config_json(drafter_dir), f"drafter {drafter_dir}")
        if kind not in ("dflash", "dflash2"):
            raise ValueError(f"methods hf_ar / stock run dflash_generate, which takes DFlash / DFlash2 drafters; "
                             f"{drafter_dir} is a {kind} drafter: use --methods hf_static,our_ar,our_spec")
        archs = AutoConfig.from_pretrained(drafter_dir).architectures or []
        cls = DFlash2DraftModel if "DFlash2DraftModel" in archs else DFlashDraftModel
        drafter = cls.from_pretrained(drafter_dir, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    return HFPair(target, drafter, torch.device(device))


def _ids(pair: HFPair, prompt_ids: list[int]) -> torch.Tensor:
    return torch.tensor([prompt_ids], dtype=torch.long, device=pair.device)  # [1, T]


def run_dflash(pair: HFPair, prompt_ids, max_new_tokens, stop_ids, block_size) -> MethodRun:
    """stock `dflash_generate` with its own timers (device-synchronized)."""
    from dflash.model import dflash_generate

    if pair.drafter is None:
        raise ValueError("dflash_generate needs a drafter (--drafter)")
    with timing.dflash_clock(pair.device):
        r = dflash_generate(pair.drafter, pair.target, _ids(pair, prompt_ids), max_new_tokens,
                            list(stop_ids) or None, 0.0, block_size=block_size, return_stats=True)
    tokens = r.output_ids[0, r.num_input_tokens:].tolist()
    return MethodRun(tokens=tokens, prefill_s=r.time_to_first_token,
                     decode_s=r.time_per_output_token * r.num_output_tokens,
                     acceptance_lengths=list(r.acceptance_lengths) if block_size > 1 else None)


class _FirstTokenClock:
    """HF streamer that notes when the first new token exists (the end of the prefill).
    `put` gets the prompt first, then each new token."""

    def __init__(self, device):
        self.device, self.calls, self.first_token_at = device, 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:
            self.first_token_at = timing.now(self.device)

    def end(self):
        pass


def run_hf_static(pair: HFPair, prompt_ids, max_new_tokens, stop_ids) -> MethodRun:
    """HF `generate`, greedy, with a static KV cache sized for this prompt (`static_cache_for`);
    stops at the first of `stop_ids`."""
    ids = _ids(pair, prompt_ids)
    cache, new = pair.static_cache_for(ids.shape[1] + max_new_tokens)
    if new:
        _hf_generate(pair, ids, min(STATIC_WARMUP_TOKENS, max_new_tokens), stop_ids, cache)
        cache, _ = pair.static_cache_for(ids.shape[1] + max_new_tokens)
    clock = _FirstTokenClock(pair.device)
    start = timing.now(pair.device)
    out = _hf_generate(pair, ids, max_new_tokens, stop_ids, cache, clock)
    end = timing.now(pair.device)
    first = clock.first_token_at if clock.first_token_at is not None else end
    return MethodRun(tokens=out[0, ids.shape[1]:].tolist(), prefill_s=first - start, decode_s=end - first)


def _hf_generate(pair: HFPair, ids, max_new_tokens, stop_ids, cache, streamer=None):
    stop = list(stop_ids) or None
    with torch.inference_mode():
        return pair.target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
            past_key_values=cache, eos_token_id=stop, pad_token_id=(stop or [0])[0], streamer=streamer)


def warm_up(fn, *args) -> float:
    """Call once untimed (allocator, kernels, lazy inits); returns its wall time for the log."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start
