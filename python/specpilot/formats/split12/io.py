"""split12 checkpoint folders: HF bf16 folder <-> split12 safetensors, bit-exact both ways.

A packed matrix `NAME` [N, K] is stored as the six tensors `NAME.split12.<plane>`; everything
else (norms, biases, 1-D, non-bf16) is stored unchanged under its own name. Every safetensors file
of a split12 folder carries the metadata FORMAT_KEYS below; readers refuse another version or
layout. Other files (config, tokenizer, ...) are copied. Writes go to a temporary sibling folder
that is renamed into place, so a folder is never half-written.
"""
import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .pack import DEFAULT_MAX_BITS, is_packable, pack_tensor, stats_of, summarize
from .reference import FORMAT_NAME, FORMAT_VERSION, KPAD_MULTIPLE, PLANES, Split12Tensor

SUFFIX = ".split12."
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MANIFEST = "split12.json"
# Layout parameters of format v1: a reader accepts exactly these.
LAYOUT = {"kpad_multiple": KPAD_MULTIPLE, "group": 8, "code": "sign<<3|cls", "nibbles": "byte g*4+j%4, j<4 low",
          "window": "per-row base, (e>>1) in [base, base+7]", "escapes": "csr int32 rowptr/col, int16 bf16 bits"}


def _format_metadata(shapes: dict, source_metadata: dict | None) -> dict:
    return {"format": FORMAT_NAME, "split12_version": str(FORMAT_VERSION), "split12_layout": json.dumps(LAYOUT),
            "split12_shapes": json.dumps(shapes), "source_metadata": json.dumps(source_metadata or {})}


def shard_files(folder: Path) -> list:
    """The safetensors files of an HF folder: the index's shards, or model.safetensors."""
    folder = Path(folder)
    if (folder / INDEX).exists():
        weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    if (folder / SINGLE).exists():
        return [SINGLE]
    raise FileNotFoundError(f"{folder}: no {SINGLE} and no {INDEX}")


def read_safetensors(path: Path):
    """-> (tensors dict, metadata dict) on the CPU."""
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def check_format(path, meta: dict) -> None:
    """Refuse anything but split12 format v1 with this layout, naming what differs."""
    if meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{path}: not a split12 file (metadata format={meta.get('format')!r})")
    version = meta.get("split12_version")
    if version != str(FORMAT_VERSION):
        raise ValueError(f"{path}: split12 version {version!r}; this build reads version {FORMAT_VERSION} only")
    layout = json.loads(meta.get("split12_layout", "null"))
    if layout != LAYOUT:
        raise ValueError(f"{path}: split12 layout {layout} differs from version {FORMAT_VERSION}'s {LAYOUT}")


def load_split12_file(path):
    """-> (packed {name: Split12Tensor}, plain {name: Tensor}, source metadata)."""
    tensors, meta = read_safetensors(Path(path))
    check_format(path, meta)
    shapes = json.loads(meta["split12_shapes"])
    packed = {}
    for name, (N, K) in shapes.items():
        try:
            planes = {plane: tensors.pop(name + SUFFIX + plane) for plane in PLANES}
        except KeyError as e:
            raise ValueError(f"{path}: packed tensor {name} lacks plane {e}") from None
        packed[name] = Split12Tensor(**planes, N=N, K=K).validate()
    return packed, tensors, json.loads(meta.get("source_metadata", "{}"))


def is_split12_folder(folder) -> bool:
    try:
        first = Path(folder) / shard_files(folder)[0]
        with safe_open(str(first), framework="pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT_NAME
    except (FileNotFoundError, OSError):
        return False


@contextlib.contextmanager
def hf_loadable(folder):
    """The folder as HF transformers (stock DFlash, the HF baselines) can load it: the folder itself,
    or for a split12 folder a bf16 unpack of it in a temporary folder, removed on exit (load the
    model inside the block)."""
    if not is_split12_folder(folder):
        yield Path(folder)
        return
    with tempfile.TemporaryDirectory(prefix="specpilot-bf16-") as tmp:
        dst = Path(tmp) / Path(folder).name
        unpack_folder(folder, dst)
        yield dst


def load_state_dict(folder) -> dict:
    """A split12 folder -> {name: Split12Tensor or Tensor} for the engine's loader."""
    out = {}
    for shard in shard_files(folder):
        packed, plain, _ = load_split12_file(Path(folder) / shard)
        out.update(packed)
        out.update(plain)
    return out


def _write_atomically(dst: Path, overwrite: bool, fill) -> None:
    """fill(tmp_folder) writes the whole result; then it replaces dst in one rename."""
    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()) and not overwrite:
        raise ValueError(f"{dst} exists and is not empty (pass --overwrite to replace it)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        fill(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
        if dst.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
            os.rename(dst, old / "x")
            os.rename(tmp, dst)
            shutil.rmtree(old)
        else:
            os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _copy_other_files(src: Path, dst: Path, shards: list) -> None:
    skip = set(shards) | {INDEX, MANIFEST}
    for item in src.iterdir():
        if item.name in skip or item.name.startswith("."):
            continue
        if item.is_dir():
            shutil.copytree(item, dst / item.name, copy_function=shutil.copyfile)
        else:
            shutil.copyfile(item, dst / item.name)


def _write_index(src: Path, dst: Path, weight_map: dict) -> None:
    if (src / INDEX).exists():
        index = json.loads((src / INDEX).read_text())
        index["weight_map"] = weight_map
        index.setdefault("metadata", {})["total_size"] = sum(
            (dst / f).stat().st_size for f in set(weight_map.values()))
        (dst / INDEX).write_text(json.dumps(index, indent=2))


def pack_folder(src, dst, max_bits_per_weight: float = DEFAULT_MAX_BITS, overwrite: bool = False) -> dict:
    """HF bf16 folder -> split12 folder. Returns the summary (also written to split12.json)."""
    src, dst = Path(src), Path(dst)
    shards = shard_files(src)
    stats, summary = [], {}

    def fill(tmp: Path):
        weight_map = {}
        for shard in shards:
            tensors, meta = read_safetensors(src / shard)
            if meta.get("format") == FORMAT_NAME:
                raise ValueError(f"{src / shard} is already split12")
            out, shapes = {}, {}
            for name, t in tensors.items():
                packed = None
                if is_packable(t):
                    packed, st = pack_tensor(name, t, max_bits_per_weight)
                    stats.append(st)
                if packed is None:
                    out[name] = t.contiguous()
                    weight_map[name] = shard
                    continue
                shapes[name] = [packed.N, packed.K]
                for plane, p in packed.planes().items():
                    out[name + SUFFIX + plane] = p
                    weight_map[name + SUFFIX + plane] = shard
            save_file(out, str(tmp / shard), metadata=_format_metadata(shapes, meta))
        _write_index(src, tmp, weight_map)
        _copy_other_files(src, tmp, shards)
        summary.update(summarize(stats), source=str(src), format=FORMAT_NAME, version=FORMAT_VERSION)
        (tmp / MANIFEST).write_text(json.dumps({"summary": summary, "tensors": [s.as_dict() for s in stats]}, indent=1))

    _write_atomically(dst, overwrite, fill)
    return summary


def unpack_folder(src, dst, overwrite: bool = False) -> int:
    """split12 folder -> HF bf16 folder with the original tensor names and values. Returns #packed."""
    src, dst = Path(src), Path(dst)
    shards = shard_files(src)
    count = 0

    def fill(tmp: Path):
        nonlocal count
        weight_map = {}
        for shard in shards:
            packed, plain, source_meta = load_split12_file(src / shard)
            from . import ops  # the C++ unpacker (bit-exact)

            out = dict(plain)
            for name, p in packed.items():
                out[name] = ops.unpack(p)
                count += 1
            weight_map.update({name: shard for name in out})
            save_file(out, str(tmp / shard), metadata=source_meta or None)
        _write_index(src, tmp, weight_map)
        _copy_other_files(src, tmp, shards)

    _write_atomically(dst, overwrite, fill)
    return count


def folder_stats(folder, max_bits_per_weight: float = DEFAULT_MAX_BITS, cast_bf16: bool = False):
    """(TensorStats of every 2-D bf16 matrix, names of the 2-D float matrices left out): read from a
    split12 folder, or computed by packing a bf16 folder in memory (nothing written). cast_bf16:
    fp32 / fp16 matrices are rounded to bf16 first and measured too (the stats are then those of the
    bf16 cast, as `specpilot pack` of a bf16 copy would see them); without it they are left out."""
    folder = Path(folder)
    stats, left_out = [], []
    split12 = is_split12_folder(folder)
    for shard in shard_files(folder):
        if split12:
            packed, _, _ = load_split12_file(folder / shard)
            stats += [stats_of(name, p) for name, p in packed.items()]
            continue
        tensors, _ = read_safetensors(folder / shard)
        for name, t in tensors.items():
            if cast_bf16 and t.dim() == 2 and t.dtype in (torch.float32, torch.float16):
                t = t.to(torch.bfloat16)
            if is_packable(t):
                stats.append(pack_tensor(name, t, max_bits_per_weight)[1])
            elif t.dim() == 2 and t.is_floating_point():
                left_out.append(name)
    return stats, left_out
