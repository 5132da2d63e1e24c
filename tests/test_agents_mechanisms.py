"""The mechanism registry against the config dataclasses, the deployment key, and the CLI listing."""
from dataclasses import fields

import pytest

from specpilot import cli
from specpilot.agents import mechanisms as M
from specpilot.agents.deployment import Deployment, distance
from specpilot.config import EngineConfig
from specpilot.engine.batch.config import BatchConfig


def test_every_config_field_is_searched_or_excused_with_a_reason():
    searched = {(m.owner, m.field) for m in M.registry()}
    for cls in (EngineConfig, BatchConfig):
        for f in fields(cls):
            listed = (cls.__name__, f.name) in searched
            excused = f"{cls.__name__}.{f.name}" in M.NOT_SEARCHED
            assert listed != excused, f"{cls.__name__}.{f.name}: searched={listed}, excused={excused}"
    assert all(reason for reason in M.NOT_SEARCHED.values())


def test_a_new_field_without_an_entry_is_refused(monkeypatch):
    table = dict(M.ENGINE_TABLE)
    del table["fused_gemv"]
    monkeypatch.setattr(M, "ENGINE_TABLE", table)
    with pytest.raises(ValueError, match="EngineConfig.fused_gemv is neither searched nor in NOT_SEARCHED"):
        M.registry()


def test_values_are_valid_config_values_and_include_the_default():
    for m in M.registry():
        assert m.default in m.values, m.name
        assert len(m.values) >= 2, m.name
        if m.owner != "run":
            cls = EngineConfig if m.owner == "EngineConfig" else BatchConfig
            assert getattr(cls(), m.field) == m.default
            for v in m.values:
                assert getattr(cls(**{m.field: v}), m.field) == v
    two_level = M.by_name()["engine.two_level"]
    assert "prefix-first" not in two_level.values  # refused by EngineConfig: not built


def test_configs_for_maps_names_to_the_dataclasses_and_refuses_bad_input():
    engine, batch, run = M.configs_for({"engine.cuda_graphs": False, "batch.ragged_verify": False,
                                        "run.block_size": 8}, "split12")
    assert engine == EngineConfig(cuda_graphs=False) and batch == BatchConfig(ragged_verify=False)
    assert run == {"block_size": 8, "weights": "split12", "drafter": 0}
    assert M.configs_for({"run.drafter": 2}, "bf16")[2]["drafter"] == 2
    with pytest.raises(ValueError, match="unknown mechanism 'engine.warp_speed'"):
        M.configs_for({"engine.warp_speed": True}, "bf16")
    with pytest.raises(ValueError, match="batch.page_size: value 7 is not one of"):
        M.configs_for({"batch.page_size": 7}, "bf16")


def test_plainest_turns_every_switch_off():
    plain = M.plainest(M.registry())
    assert plain["engine.cuda_graphs"] is False and plain["batch.ragged_verify"] is False
    assert plain["engine.attention"] == "sdpa" and plain["run.weights"] == "bf16"
    assert plain["engine.two_level"] == "off" and plain["engine.draft_vocab"] == 0 and plain["run.drafter"] == 0


def test_deployment_key_round_trip_scopes_and_distance():
    d = Deployment("qwen3-8b", "dflash-b16", "H100", 16, "split12")
    assert d.key == "H100|qwen3-8b|dflash-b16|C16|split12" and Deployment.from_key(d.key) == d
    assert d.supports("batched") and d.supports("cuda") and d.supports("split12")
    cpu1 = Deployment("tiny", "none", "cpu", 1, "bf16")
    assert not any(cpu1.supports(s) for s in ("batched", "cuda", "split12", "drafter"))
    near = Deployment("qwen3-8b", "dflash-b16", "H100", 32, "split12")
    far = Deployment("llama-3.1-8b", "dflash-b16", "H200", 16, "split12")
    assert distance(d, near) < distance(d, far)
    for bad in (dict(concurrency=0), dict(weights="fp8"), dict(card="a|b")):
        args = {**d.info(), **bad}
        with pytest.raises(ValueError, match="Deployment"):
            Deployment(**args)
    with pytest.raises(ValueError, match="not card"):
        Deployment.from_key("H100|qwen3-8b")


def test_list_mechanisms_cli_prints_one_line_per_mechanism(capsys):
    assert cli.main(["optimize", "--list-mechanisms"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [m.name for m in M.registry()]
    assert [line.split()[0] for line in lines] == names
    assert any(line.startswith("batch.ragged_verify") and "[*True, False]" in line for line in lines)
    assert any(line.startswith("engine.draft_vocab") and "4096" in line for line in lines)
