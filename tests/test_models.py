"""Loaders and modules: our forward equals HF's (fp32), sharded == single file, and every bad
input raises a clear error before anything is loaded."""
import json
import shutil

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.engine.cache import KVCache
from specpilot.models import load_drafter, load_target
from specpilot.models.layers import rope_inv_freq
from specpilot.models.random_ckpt import TARGET_PRESETS, write_pair


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for preset, ids in (("tiny-qwen3", [0, 3]), ("tiny-llama", [1, 3])):
        base = tmp_path_factory.mktemp(preset)
        out[preset] = write_pair(base, preset, layer_ids=ids, block_size=4, seed=fresh_seed())
    return out


def copy_pair(folders, tmp_path, preset="tiny-qwen3"):
    t, d = folders[preset]
    return shutil.copytree(t, tmp_path / "t"), shutil.copytree(d, tmp_path / "d")


def edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_forward_matches_hf(folders, preset):
    from transformers import AutoModelForCausalLM

    tdir, _ = folders[preset]
    ours = load_target(tdir, dtype=torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=torch.float32, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(fresh_seed())
    ids = torch.randint(0, ours.config.vocab_size, (1, 37), generator=g)
    c = ours.config
    cache = KVCache(c.num_layers, 1, c.num_kv_heads, 64, c.head_dim, "cpu", torch.float32)
    layers = tuple(range(c.num_layers))
    with torch.inference_mode():
        logits, feats = ours(ids, torch.arange(37), cache, 37, feature_layers=layers)
        ref = hf(ids, output_hidden_states=True)
    # fp32 with differently shaped (fused) GEMMs: agreement to fp32 rounding of the sums.
    torch.testing.assert_close(logits, ref.logits, rtol=1e-4, atol=1e-4)
    want = torch.cat([ref.hidden_states[i + 1] for i in layers], dim=-1)
    torch.testing.assert_close(feats, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(logits.argmax(-1), ref.logits.argmax(-1))


def test_llama3_rope_frequencies_match_hf():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = TARGET_PRESETS["llama-3.1-8b"]
    hf_cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, head_dim=128,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192})
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    assert torch.equal(rope_inv_freq(cfg.rope, 128), want)


def test_sharded_equals_single(folders, tmp_path):
    from specpilot.models.random_ckpt import save_safetensors
    from specpilot.models.checkpoint import read_state_dict

    t, d = copy_pair(folders, tmp_path)
    state = read_state_dict(t)
    (t / "model.safetensors").unlink()
    save_safetensors(state, t, max_shard_bytes=50_000)
    assert len(list(t.glob("model-*.safetensors"))) > 2
    a = load_target(folders["tiny-qwen3"][0], dtype=torch.float32)
    b = load_target(t, dtype=torch.float32)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    assert b.lm_head.weight is b.embed.weight          # tied stays tied


def test_target_errors(folders, tmp_path):
    t, d = copy_pair(folders, tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_target(tmp_path / "nope")
    with pytest.raises(ValueError, match="weights='int4'"):
        load_target(t, weights="int4")
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        load_target(t, dtype="fp8")
    edit_config(t, architectures=["MistralForCausalLM"])
    with pytest.raises(ValueError, match="MistralForCausalLM"):
        load_target(t)
    edit_config(t, architectures=["Qwen3ForCausalLM"], rope_parameters={"rope_type": "yarn", "rope_theta": 1.0})
    with pytest.raises(ValueError, match="yarn"):
        load_target(t)
    edit_config(t, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, hidden_size=None)
    with pytest.raises(ValueError, match="hidden_size"):
        load_target(t)
    edit_config(t, hidden_size=64, num_key_value_heads=3)
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        load_target(t)
    edit_config(t, num_key_value_heads=2, intermediate_size=64)       # config no longer fits the tensors
    with pytest.raises(ValueError, match="shapes do not match"):
        load_target(t)
    edit_config(t, intermediate_size=128, num_hidden_layers=5)
    with pytest.raises(ValueError, match="model.layers.4"):
        load_target(t)
    edit_config(t, num_hidden_layers=4)
    (t / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_target(t)
    (t / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_target(t)
    shutil.copy(folders["tiny-qwen3"][0] / "config.json", t / "config.json")
    (t / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="safetensors"):
        load_target(t)
    (t / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_target(t)


def test_drafter_errors(folders, tmp_path):
    t, d = copy_pair(folders, tmp_path)
    target = load_target(t, dtype=torch.float32)
    edit_config(d, dflash_config={"target_layer_ids": [0, 9], "mask_token_id": 319, "block_size": 4})
    with pytest.raises(ValueError, match=r"\[9\]"):
        load_drafter(d, target)
    edit_config(d, dflash_config={"target_layer_ids": [0, 3], "mask_token_id": 999, "block_size": 4})
    with pytest.raises(ValueError, match="mask_token_id 999"):
        load_drafter(d, target)
    edit_config(d, dflash_config={"target_layer_ids": [0, 3], "block_size": 4})
    with pytest.raises(ValueError, match="mask_token_id"):
        load_drafter(d, target)
    edit_config(d, dflash_config=None)
    with pytest.raises(ValueError, match="dflash_config"):
        load_drafter(d, target)
    edit_config(d, dflash_config={"target_layer_ids": [0, 3], "mask_token_id": 319, "block_size": 4},
                hidden_size=32)
    with pytest.raises(ValueError, match="hidden_size 32"):
        load_drafter(d, target)
    edit_config(d, hidden_size=64, vocab_size=300)
    with pytest.raises(ValueError, match="vocab_size 300"):
        load_drafter(d, target)
    edit_config(d, vocab_size=320, architectures=["EagleModel"])
    with pytest.raises(ValueError, match="EagleModel"):
        load_drafter(d, target)
    edit_config(d, architectures=["DFlashDraftModel"])
    from safetensors.torch import load_file, save_file
    state = load_file(str(d / "model.safetensors"))
    state["embed_tokens.weight"] = torch.zeros(320, 64)
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="embed_tokens"):
        load_drafter(d, target)


def test_request_errors(folders):
    t, d = folders["tiny-qwen3"]
    target = load_target(t, dtype=torch.float32)
    eng = Engine(target, load_drafter(d, target), max_seq_len=64)
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate_spec([], 4)
    with pytest.raises(ValueError, match="exceeds the engine's max_seq_len=64"):
        eng.generate_spec(list(range(60)), 8)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        eng.generate_ar([1, 2], 0)
    with pytest.raises(ValueError, match=r"outside the vocab"):
        eng.generate_ar([1, 5000], 3)
    with pytest.raises(ValueError, match="temperature=-1"):
        eng.generate_ar([1, 2], 3, temperature=-1)
    with pytest.raises(ValueError, match="needs a drafter"):
        Engine(target).generate_spec([1, 2], 3)


def test_split12_weights_option(folders, tmp_path):
    """weights='split12' swaps the linears (or says what is missing); a `specpilot pack` folder runs
    split12 by default (as stored), and with weights='bf16' loads to the very same bf16 weights as
    its source."""
    t, _ = folders["tiny-qwen3"]
    try:
        from specpilot.formats.split12 import io as split12_io
        from specpilot.formats.split12.linear import Split12Linear
    except ImportError:
        with pytest.raises(RuntimeError, match="swap_linears"):
            load_target(t, dtype=torch.bfloat16, weights="split12")
        return
    with pytest.raises(ValueError, match="bf16"):
        load_target(t, dtype=torch.float32, weights="split12")
    t, _ = write_pair(tmp_path / "bf16", "tiny-qwen3", layer_ids=[0, 3], seed=fresh_seed(), dtype=torch.bfloat16)
    summary = split12_io.pack_folder(t, tmp_path / "packed")
    assert split12_io.is_split12_folder(tmp_path / "packed"), summary
    plain, packed = load_target(t), load_target(tmp_path / "packed", weights="bf16")
    for (na, a), (nb, b) in zip(plain.state_dict().items(), packed.state_dict().items()):
        assert na == nb and torch.equal(a, b)
    as_stored = load_target(tmp_path / "packed")
    assert isinstance(as_stored.layers[0].attn.qkv, Split12Linear)
    assert not isinstance(load_target(tmp_path / "packed", dtype=torch.float32).layers[0].attn.qkv, Split12Linear)
    with pytest.raises(ValueError, match="as stored"):
        load_target(t, weights="int4")
    swapped = load_target(t, weights="split12")
    assert isinstance(swapped.layers[0].attn.qkv, Split12Linear) and isinstance(swapped.lm_head, Split12Linear)
    out = Engine(swapped, max_seq_len=64).generate_ar([1, 2, 3], 5)
    assert len(out.tokens) <= 5 and all(0 <= x < swapped.config.vocab_size for x in out.tokens)
