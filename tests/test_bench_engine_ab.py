"""bench/engine_ab and bench/ab_configs on the CPU: configurations parsed against EngineConfig's
fields (bad ones refused by name), the summary table, and gpu_check.sh's A/B configurations valid."""
import dataclasses
import pathlib
import re
import typing

import pytest

from specpilot.bench import engine_ab
from specpilot.bench.ab_configs import AbConfig, parse_config, parse_configs

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class FakeConfig:
    """Stands in for EngineConfig: one field of each kind the parser must handle."""
    cuda_graphs: bool = True
    decode_splits: int = 16
    attention: typing.Literal["auto", "specpilot", "sdpa"] = "auto"
    variants_manifest: typing.Optional[str] = None
    ratio: float = 1.0

    def __post_init__(self):
        if self.decode_splits < 1:
            raise ValueError(f"decode_splits={self.decode_splits} must be >= 1")


def test_default_and_overrides_parse_by_field_type():
    assert parse_config("default", FakeConfig) == AbConfig("default", {}, "bf16")
    c = parse_config("cuda_graphs=off+decode_splits=32+attention=sdpa+variants_manifest=m.json+weights=split12",
                     FakeConfig)
    assert c.overrides == {"cuda_graphs": False, "decode_splits": 32, "attention": "sdpa",
                           "variants_manifest": "m.json"}
    assert c.weights == "split12"
    assert c.engine_config(FakeConfig) == FakeConfig(False, 32, "sdpa", "m.json")
    assert parse_config("variants_manifest=none+ratio=0.5", FakeConfig).overrides == {"variants_manifest": None,
                                                                                      "ratio": 0.5}


@pytest.mark.parametrize("text, message", [
    ("no_such=1", "'no_such' is not an EngineConfig field; the fields are: weights, attention, cuda_graphs"),
    ("cuda_graphs=maybe", "cuda_graphs='maybe': a bool"),
    ("decode_splits=many", "decode_splits='many': an int is needed"),
    ("attention=cudnn", "attention='cudnn': choose one of auto, specpilot, sdpa"),
    ("weights=fp8", "weights='fp8': choose one of bf16, split12"),
    ("cuda_graphs", "'cuda_graphs' in 'cuda_graphs': expected field=value"),
    ("cuda_graphs=1+cuda_graphs=0", "'cuda_graphs' is set twice"),
    ("decode_splits=0", "decode_splits=0 must be >= 1"),          # the dataclass's own check, at parse time
    (" ", "an empty configuration"),
])
def test_bad_configurations_are_refused_by_name(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_config(text, FakeConfig)


def test_a_configuration_given_twice_is_refused():
    assert [c.name for c in parse_configs("default,weights=split12", FakeConfig)] == ["default", "weights=split12"]
    with pytest.raises(ValueError, match="given twice: default"):
        parse_configs("default,default", FakeConfig)


def test_cli_refuses_bad_configs_before_touching_a_gpu(monkeypatch):
    monkeypatch.setattr(engine_ab, "engine_config_class", lambda: FakeConfig)
    with pytest.raises(SystemExit, match="--configs: 'fused' is not an EngineConfig field"):
        engine_ab.main(["--configs", "default,fused=1"])


def _row(config, rep, ar, verify, draft, weights="bf16", **extra):
    return {"config": config, "weights": weights, "rep": rep, "floor_ms": 4.0, "ar_ms": ar, "verify_ms": verify,
            "draft_ms": draft, **extra}


def test_summary_takes_medians_per_configuration_in_first_seen_order():
    rows = [_row("default", 0, 5.0, 5.5, 1.2), _row("weights=split12", 0, 4.0, 5.0, 1.0, "split12"),
            _row("default", 1, 5.2, 5.7, 1.4), _row("weights=split12", 1, 4.2, 5.2, 1.2, "split12"),
            _row("default", 2, 9.0, 5.6, 1.3), _row("weights=split12", 2, 4.1, 5.1, 1.1, "split12")]
    s = engine_ab.summarize(rows)
    assert [(x["config"], x["reps"], x["ar_ms"], x["verify_ms"], x["draft_ms"]) for x in s] == [
        ("default", 3, 5.2, 5.6, 1.3), ("weights=split12", 3, 4.1, 5.1, 1.1)]
    lines = engine_ab.table(s).splitlines()
    assert lines[0].startswith("| config | weights | reps | AR ms | verify16 ms | draft ms | verify/AR")
    assert lines[2] == "| default | bf16 | 3 | 5.200 | 5.600 | 1.300 | 1.077 | 0.232 | 1.300 | 1.000x |"
    assert lines[3] == "| weights=split12 | split12 | 3 | 4.100 | 5.100 | 1.100 | 1.244 | 0.216 | 1.025 | 1.268x |"
    assert "e2e" not in lines[0]


def test_table_shows_the_replayed_generation_when_measured():
    rows = [_row("default", 0, 5.0, 5.5, 1.2, e2e_ar_ms_per_token=5.3, e2e_spec_ms_per_step=7.0,
                 e2e_spec_tokens_per_s=927.14)]
    lines = engine_ab.table(engine_ab.summarize(rows)).splitlines()
    assert lines[0].endswith("| e2e AR ms/token | e2e spec ms/step | e2e spec tok/s |")
    assert lines[2].endswith("| 5.300 | 7.000 | 927.1 |")


def test_gpu_check_configurations_are_valid_engine_configs():
    """Every --configs in bench/gpu_check.sh names real EngineConfig fields with parseable values."""
    from specpilot import config

    script = (ROOT / "bench" / "gpu_check.sh").read_text()
    found = re.findall(r"engine_ab [^;]*?--configs (\S+)", script.replace("\\\n", " "))
    assert len(found) == 3
    for text in found:
        assert parse_configs(text, config.EngineConfig)
