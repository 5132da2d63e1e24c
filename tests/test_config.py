"""EngineConfig: one frozen place for every kernel and mechanism choice, validated, and handed by
the Engine to the models' op dispatch around every forward it runs."""
import dataclasses

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed
from specpilot import config
from specpilot.config import EngineConfig


def test_defaults_are_the_measured_winners():
    c = EngineConfig()
    assert (c.cuda_graphs, c.fused_steps, c.early_launch, c.step_kernels, c.fused_kernels, c.fused_gemv,
            c.gemv_pdl, c.skinny_gemm, c.split12_decode_grid, c.attention_fused_rope, c.attention_pdl) == (True,) * 11
    assert (c.compile_layers, c.attention, c.variants_manifest) == (False, "auto", None)
    assert config.current() == c                                   # outside an engine: the defaults


def test_every_field_is_documented():
    import inspect

    source = inspect.getsource(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        after = source.split(f"    {f.name}:", 1)[1].split("\n", 2)[1].strip()
        assert after.startswith('"""'), f"EngineConfig.{f.name} has no docstring"


@pytest.mark.parametrize("changes, message", [
    ({"attention": "flash"}, "attention must be one of"),
    ({"skinny_gemm": 1}, "skinny_gemm must be True or False"),
    ({"variants_manifest": 3}, "variants_manifest must be a path"),
])
def test_bad_values_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**changes)


def test_frozen_and_scoped():
    c = EngineConfig(skinny_gemm=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.skinny_gemm = True
    with config.use(c):
        assert config.current() is c
    assert config.current() == EngineConfig()
    with pytest.raises(TypeError, match="EngineConfig"):
        with config.use({"skinny_gemm": False}):
            pass


def test_the_engine_hands_its_config_to_every_forward(tmp_path, monkeypatch):
    pair = Pair(tmp_path, "tiny-qwen3", [0, 2], block_size=4, seed=fresh_seed())
    from specpilot.engine import Engine

    with pytest.raises(TypeError, match="EngineConfig"):
        Engine(pair.target, pair.drafter, max_seq_len=64, config={"cuda_graphs": False})
    mine = EngineConfig(skinny_gemm=False, attention="sdpa")
    engine = Engine(pair.target, pair.drafter, max_seq_len=128, config=mine)
    seen = []
    real = type(pair.target).forward
    monkeypatch.setattr(type(pair.target), "forward", lambda *a, **k: seen.append(config.current()) or real(*a, **k))
    prompt = pair.random_prompt(7)
    ours = engine.generate_spec(prompt, 10).tokens
    assert seen and all(c is mine for c in seen)                   # prefill, draft and verify forwards
    seen.clear()
    assert pair.engine.generate_spec(prompt, 10).tokens == ours    # CPU: the choices change no bit
    assert seen and all(c == EngineConfig() for c in seen)
