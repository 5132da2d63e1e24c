"""The referee: the target at a higher precision than the run, scoring near-ties.

A bf16 / fp16 run is refereed by the target in fp32, an fp32 run by the target in fp64. The referee
is stock's own model class (HF transformers, loaded from the same folder at the higher precision),
so it shares none of our kernels. (HF's RMSNorm computes in fp32 whatever the model dtype, so the
fp64 referee is fp64 in its matmuls and attention and fp32 in its norms: still far closer to exact
than an fp32 run, whose error grows with every accumulated product.)

Placement (`device="auto"`): on the run's GPU when its free memory holds the referee's weights with
headroom, else on the host when the host's available memory does; when neither does (or loading
runs out of memory) there is no referee and the verdict falls back to the ulp rule (verdict.py),
which the report says.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

REFEREE_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
GPU_HEADROOM = 1.25          # weights x this + 2 GiB: activations and logits of one teacher-forced pass
GPU_SPARE_BYTES = 2 << 30


@dataclass
class Referee:
    kind: str                       # "fp32", "fp64" or "none" (the ulp fallback)
    model: torch.nn.Module | None   # an HF causal LM at the referee's dtype; None for "none"
    device: str = ""
    note: str = ""                  # where it runs, or why there is none


def referee_kind(run_dtype: torch.dtype) -> str:
    """fp64 for an fp32 run, fp32 for a bf16 / fp16 run."""
    if run_dtype == torch.float32:
        return "fp64"
    if run_dtype in (torch.bfloat16, torch.float16):
        return "fp32"
    raise ValueError(f"no referee for a run in {run_dtype} (bf16, fp16 or fp32 runs are refereed)")


def no_referee(note: str) -> Referee:
    return Referee("none", None, "", note)


def _weight_bytes(target_dir, dtype: torch.dtype) -> int:
    """The referee's weight bytes: the checkpoint's parameter count x the referee's element size."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specpilot.formats.split12.io import hf_loadable

    with hf_loadable(target_dir) as folder:
        config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()) * torch.empty(0, dtype=dtype).element_size()


def _host_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def place(need: int, run_device: str, device: str = "auto") -> str | None:
    """'cuda', 'cpu', or None (fits nowhere) for a referee of `need` weight bytes."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"referee device {device!r}: use auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("referee device 'cuda' requested but torch sees no CUDA GPU")
    if device != "auto":
        return device
    if run_device == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        if need * GPU_HEADROOM + GPU_SPARE_BYTES <= free:
            return "cuda"
    return "cpu" if need * GPU_HEADROOM <= _host_available_bytes() else None


def load_referee(target_dir, run_dtype: torch.dtype, run_device: str = "cpu", choice: str = "auto",
                 device: str = "auto") -> Referee:
    """The referee for a run of the target in `run_dtype` on `run_device`. choice "none" forces the
    ulp fallback; device auto | cpu | cuda (see the module doc)."""
    if choice not in ("auto", "none"):
        raise ValueError(f"referee {choice!r}: use auto (the higher-precision twin) or none (the ulp rule)")
    if choice == "none":
        return no_referee("--referee none: no referee, the ulp fallback rule judges near-ties")
    from transformers import AutoModelForCausalLM

    from specpilot.formats.split12.io import hf_loadable

    kind = referee_kind(run_dtype)
    dtype = REFEREE_DTYPES[kind]
    need = _weight_bytes(target_dir, dtype)
    where = place(need, str(torch.device(run_device).type), device)
    if where is None:
        return no_referee(f"the {kind} referee ({need / 2**30:.1f} GiB) fits neither the GPU nor the host: "
                          "the ulp fallback rule judges near-ties")
    try:
        with hf_loadable(target_dir) as folder:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
        model = model.to(where).eval().requires_grad_(False)
    except (torch.cuda.OutOfMemoryError, MemoryError) as e:
        return no_referee(f"loading the {kind} referee on {where} ran out of memory ({type(e).__name__}): "
                          "the ulp fallback rule judges near-ties")
    return Referee(kind, model, where, f"{kind} twin of the target on {where} ({need / 2**30:.2f} GiB)")


@torch.inference_mode()
def scored_logits(model, sequence, generated: int) -> torch.Tensor:
    """An HF causal LM's logits [generated, V] (its own dtype, on the CPU) at the positions that chose
    the last `generated` tokens of `sequence`: one forward over the whole sequence."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(map(int, sequence))], dtype=torch.long, device=device)
    logits = model(ids, logits_to_keep=generated + 1).logits[0, :-1]     # the last row chose nothing
    return logits.cpu()
