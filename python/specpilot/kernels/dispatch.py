"""Dispatch to agent-integrated kernel variants: the hook the split12 ops call for M = 1.

`integrated_launcher(op, weight_shape, device, manifest)` returns a launcher for the variant the
agent loop integrated for this GPU, op and [N, K] in the manifest (a JSON file written by
kernels/registry.py; by default the one named in the running EngineConfig.variants_manifest), or
None when there is none (no manifest, CPU, no entry, a non-CUDA record): the caller then runs its
own kernel. The launcher is

    fn(x [1, K] bf16, lo, codes, base, esc_rowptr, esc_col, esc_val, out [1, N] bf16) -> None

and launches on torch's current stream with no allocation and no synchronization, so it can be
captured in a CUDA graph. Compiled kernels are cached per process (and as cubins on disk by the
JIT), keyed by the variant record, and re-read when the registry file changes.

Exactness contract: an integrated variant passed the agent gate (bit-exact decode, exact
small-integer sums, fp32-accumulation bound against fp64) and the engine's token forcing; it is
not guaranteed bit-identical to split12_linear (its reduction order is its own).
"""
import json
from pathlib import Path

from specpilot import config
from specpilot.kernels import registry

SUPPORTED_OPS = ("split12_gemv",)
_LAUNCHERS = {}   # (manifest stamp, gpu, op, shape) -> launcher or None


def _manifest_stamp(path: Path):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (str(path), st.st_mtime_ns, st.st_size)


def integrated_launcher(op: str, weight_shape, device, manifest: str | None = None):
    """The integrated variant's launcher for `op` on an [N, K] weight on `device`, or None.
    manifest: the variants manifest path (None: the running EngineConfig's, which may be None)."""
    if op not in SUPPORTED_OPS:
        raise ValueError(f"integrated_launcher: op must be one of {SUPPORTED_OPS}, got {op!r}")
    if len(weight_shape) != 2:
        raise ValueError(f"integrated_launcher: weight_shape must be (N, K), got {tuple(weight_shape)}")
    if getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return None
    manifest = manifest if manifest is not None else config.current().variants_manifest
    if manifest is None:
        return None
    stamp = _manifest_stamp(Path(manifest))
    if stamp is None:
        raise FileNotFoundError(f"variants manifest {manifest!r} (EngineConfig.variants_manifest) does not exist")
    import torch

    gpu = torch.cuda.get_device_name(torch.device(device))
    shape = tuple(int(d) for d in weight_shape)
    key = (stamp, gpu, op, shape)
    if key not in _LAUNCHERS:
        record = registry.integrated_variant(gpu, op, shape, Path(manifest))
        _LAUNCHERS[key] = _build(record, shape, manifest) if record else None
    return _LAUNCHERS[key]


def _build(record: dict, shape, manifest):
    """Record -> launcher. Exploit launchers and non-CUDA records are never dispatched."""
    from specpilot.kernels.jit import JitKernel
    from specpilot.kernels.variants.split12_gemv_cuda import GemvParams

    params = dict(record.get("params") or {})
    if record.get("kind") != "cuda" or params.get("launcher", "default") != "default":
        return None
    source_path = record.get("source_path")
    if not source_path or not Path(source_path).exists():
        raise FileNotFoundError(f"integrated variant {record.get('cand_id')} for {shape}: source "
                                f"{source_path!r} is missing (manifest {manifest})")
    kernel = JitKernel(Path(source_path).read_text(), "split12_gemv")
    n, k = shape
    kpad = (k + 31) // 32 * 32
    grid, block = GemvParams.from_params(params).launch(n)

    def launch(x, lo, codes, base, esc_rowptr, esc_col, esc_val, out):
        # x [1, K], out [1, N]: contiguous, so the flat pointers are the contract's vectors
        kernel(grid, block, (lo, codes, base, esc_rowptr, esc_col, esc_val, x, out, n, k, kpad))

    launch.record = json.loads(json.dumps(record))
    launch.compiled = kernel.compiled
    return launch
