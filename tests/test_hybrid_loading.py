"""Loading Qwen3.5 hybrid folders: the multimodal wrapper's text model loads the same weights, and
configs or checkpoints that do not fit are refused with errors naming the problem."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.models import load_drafter, load_target
from specpilot.models.hybrid import HybridLM
from specpilot.models.random_ckpt import write_pair


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("hybrid_load")
    return write_pair(base, "tiny-qwen3.5", layer_ids=[0, 2], block_size=4, seed=5)


def edited(src, dst, config_edit=None, state_edit=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(config_edit(cfg) if config_edit else cfg))
    save_file(state_edit(state) if state_edit else state, str(dst / "model.safetensors"))
    return dst


def test_loads_and_runs(folders):
    target = load_target(folders[0], dtype=torch.float32)
    assert isinstance(target, HybridLM) and target.config.gdn_layers == (0, 1, 2)
    assert target.config.attention_layers == (3,) and target.config.rotary_dim == 8
    assert load_drafter(folders[1], target).target is target


def test_conditional_generation_folder_loads_the_text_model(folders, tmp_path):
    def wrap_config(cfg):
        return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                "text_config": {k: v for k, v in cfg.items() if k != "architectures"},
                "vision_config": {"depth": 1}, "tie_word_embeddings": cfg["tie_word_embeddings"]}

    def wrap_state(state):
        out = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
        out["model.visual.patch_embed.weight"] = torch.zeros(2, 2)      # not ours: ignored
        out["mtp.fc.weight"] = torch.zeros(2, 2)
        return out

    wrapped = edited(folders[0], tmp_path / "vl", wrap_config, wrap_state)
    plain, vl = load_target(folders[0], dtype=torch.float32), load_target(wrapped, dtype=torch.float32)
    assert vl.config == plain.config
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), vl.state_dict().values()))


@pytest.mark.parametrize("edit, message", [
    (lambda c: {**c, "layer_types": ["linear_attention"] * 3 + ["sliding_attention"]},
     r"layer_types \['sliding_attention'\] are not supported"),
    (lambda c: {**c, "layer_types": ["linear_attention"] * 4}, "no full_attention layer"),
    (lambda c: {**c, "layer_types": ["linear_attention"] * 2}, "layer_types has 2 entries for num_hidden_layers=4"),
    (lambda c: {**c, "linear_num_value_heads": 3},
     "linear_num_value_heads=3 is not a multiple of linear_num_key_heads=2"),
    (lambda c: {**c, "num_key_value_heads": 3}, "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
    (lambda c: {**c, "linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim=1 must be >= 2"),
    (lambda c: {**c, "linear_conv_kernel_dim": 3}, "conv width 4 != linear_conv_kernel_dim 3"),
    (lambda c: {k: v for k, v in c.items() if k != "linear_num_key_heads"}, "no 'linear_num_key_heads'"),
])
def test_bad_configs_are_refused(folders, tmp_path, edit, message):
    with pytest.raises(ValueError, match=message):
        load_target(edited(folders[0], tmp_path / "bad", edit), dtype=torch.float32)


def test_bad_checkpoints_are_refused(folders, tmp_path):
    def drop_conv(state):
        return {k: v for k, v in state.items() if k != "model.layers.1.linear_attn.conv1d.weight"}

    with pytest.raises(ValueError, match="lacks tensor 'model.layers.1.linear_attn.conv1d.weight'"):
        load_target(edited(folders[0], tmp_path / "a", state_edit=drop_conv), dtype=torch.float32)

    def more_heads(cfg):
        return {**cfg, "linear_num_value_heads": 8}

    with pytest.raises(ValueError, match="tensor shapes do not match the config"):
        load_target(edited(folders[0], tmp_path / "b", more_heads), dtype=torch.float32)


def test_drafter_for_another_target_is_refused(folders, tmp_path):
    def deeper(cfg):
        return {**cfg, "dflash_config": {**cfg["dflash_config"], "target_layer_ids": [0, 6]}}

    target = load_target(folders[0], dtype=torch.float32)
    bad = tmp_path / "drafter"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(deeper(json.loads((folders[1] / "config.json").read_text()))))
    save_file(load_file(str(folders[1] / "model.safetensors")), str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"include \[6\], outside the target's layers 0..3"):
        load_drafter(bad, target)


def test_split12_pack_round_trip(tmp_path):
    """`specpilot pack` of a hybrid folder loads back bit-exact, and runs split12 linears in bf16."""
    from specpilot.cli import main
    from specpilot.engine import Engine
    from specpilot.models.loading import weights_of

    src, _ = write_pair(tmp_path / "bf16", "tiny-qwen3.5", layer_ids=[0, 2], block_size=4, seed=6,
                        dtype=torch.bfloat16)
    assert main(["pack", str(src), str(tmp_path / "packed")]) == 0
    plain = load_target(src, dtype=torch.bfloat16, weights="bf16")
    packed = load_target(tmp_path / "packed", dtype=torch.bfloat16)
    assert weights_of(packed) == "split12" and weights_of(plain) == "bf16"
    unpacked = load_target(tmp_path / "packed", dtype=torch.bfloat16, weights="bf16")
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), unpacked.state_dict().values()))
    prompt = list(range(3, 40))
    ar = Engine(plain, None, max_seq_len=128).generate_ar(prompt, 16).tokens
    assert Engine(packed, None, max_seq_len=128).generate_ar(prompt, 16).tokens == ar


def test_qwen3_next_folder_loads_moe_and_grouped_projections(tmp_path):
    """Qwen3-Next: the grouped in_proj_qkvz / in_proj_ba rows land in our [q; k; v; z; b; a] layout, the
    per-expert tensors in SparseMoE; the fused (transformers) expert form loads the same model."""
    from specpilot.models.moe import SparseMoE

    src, _ = write_pair(tmp_path / "next", "tiny-qwen3-next", layer_ids=[0, 2], block_size=4, seed=7)
    target = load_target(src, dtype=torch.float32)
    assert target.config.family == "qwen3_next" and target.config.moe_layers == (0, 2, 3)
    assert isinstance(target.layers[0].mlp, SparseMoE) and not isinstance(target.layers[1].mlp, SparseMoE)

    def fuse_experts(state):
        out = {k: v for k, v in state.items() if ".mlp.experts." not in k}
        for i in (0, 2, 3):
            e = f"model.layers.{i}.mlp.experts."
            out[e + "gate_up_proj"] = torch.stack([torch.cat([state[f"{e}{x}.gate_proj.weight"],
                                                              state[f"{e}{x}.up_proj.weight"]]) for x in range(4)])
            out[e + "down_proj"] = torch.stack([state[f"{e}{x}.down_proj.weight"] for x in range(4)])
        return out

    fused = load_target(edited(src, tmp_path / "fused", state_edit=fuse_experts), dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(target.state_dict().values(), fused.state_dict().values()))


def test_sparse_moe_equals_transformers_block(tmp_path):
    from transformers import AutoModelForCausalLM

    src, _ = write_pair(tmp_path / "next", "tiny-qwen3-next", layer_ids=[0, 2], block_size=4, seed=8)
    ours = load_target(src, dtype=torch.float32).layers[2].mlp
    theirs = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).model.layers[2].mlp
    x = torch.randn(1, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(x)
        torch.testing.assert_close(ours(x), expected[0] if isinstance(expected, tuple) else expected,
                                   atol=1e-5, rtol=1e-5)
