"""The cost model on hybrid recurrent targets (Qwen3.5 layout): the shape read from config.json (GDN
layers apart from attention layers), the step components (attention, K/V and the gated q only on
attention layers, GDN projections and the recurrent state traffic on GDN layers), the gap table and
the batched step model with a `recurrent` kind."""
import json

import pytest

from specpilot.bench.random_checkpoint import main as write_checkpoint
from specpilot.cost import cost_report
from specpilot.cost.batched import Acceptance, batched_step, format_step
from specpilot.cost.ceilings import Ceilings
from specpilot.cost.shapes import ModelShape, step_components


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("cost_hybrid")
    assert write_checkpoint(["--preset", "qwen3.5-9b", "--out", str(out), "--configs-only"]) == 0
    return out / "target", out / "drafter"


def test_shape_of_a_hybrid(pair, tmp_path):
    t = ModelShape.from_dir(pair[0])
    c = json.loads((pair[0] / "config.json").read_text())
    c = c.get("text_config", c)
    assert t.recurrent.layers == c["layer_types"].count("linear_attention") == 24 and t.attention_layers == 8
    assert t.gated_attention and t.recurrent.state_bytes == 32 * 128 * 128 * 4
    nested = tmp_path / "vl"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"text_config": c, "model_type": "qwen3_5"}))
    assert ModelShape.from_dir(nested).recurrent == t.recurrent        # Qwen3_5ForConditionalGeneration nests it


def test_components_split_attention_and_gdn_layers(pair):
    t, d = ModelShape.from_dir(pair[0]), ModelShape.from_dir(pair[1])
    comps = {(c.step, c.name): c for c in step_components(t, d, 5, batch=4, block_size=16, context=512)}
    assert comps["verify", "qkv"].count == 8 and comps["verify", "gdn.in_proj"].count == 24
    assert comps["verify", "gate_up"].count == 32 and comps["verify", "attention"].count == 8
    assert comps["verify", "qkv"].n == (2 * 16 + 2 * 4) * 256                 # gated q: twice the heads
    gdn = comps["verify", "gdn"]
    assert gdn.kind == "recurrent" and gdn.count == 24
    assert gdn.extra == ((4 + 64) * t.recurrent.state_bytes,)                # 4 states read, 64 rows' written
    assert comps["decode", "gdn"].extra == (8 * t.recurrent.state_bytes,)
    assert ("draft", "draft.gdn") not in comps                                 # the DFlash drafter is dense


def test_gap_table_times_the_recurrence(tmp_path):
    assert write_checkpoint(["--preset", "tiny-qwen3.5", "--out", str(tmp_path), "--configs-only"]) == 0
    report = cost_report(tmp_path / "target", tmp_path / "drafter", batch=2, block_size=4, tau=2.0, context=64,
                         device="cpu", weights="bf16", quick=True,
                         ceilings=Ceilings("cpu", "stated", 1e11, 1e12, 1e-6, "float32"))
    rows = {(r["step"], r["name"]): r for r in report.rows}
    state = ModelShape.from_dir(tmp_path / "target").recurrent.state_bytes
    assert rows["verify", "gdn"]["kind"] == "recurrent" and rows["verify", "gdn"]["measured_s"] > 0
    assert rows["verify", "gdn"]["bytes"] == (2 + 8) * state and rows["decode", "gdn"]["bytes"] == 4 * state


def test_batched_model_prices_the_per_row_states(pair):
    ceil = Ceilings("cuda", "H100 (stated)", 3.03e12, 9.89e14, 1.04e-6, "bfloat16")
    t, d = ModelShape.from_dir(pair[0]), ModelShape.from_dir(pair[1])
    steps = [batched_step(t, d, 5, c, Acceptance.geometric(6.49, 16), ceil) for c in (1, 32)]
    share = [s["breakdown"]["verify"]["recurrent"] / sum(s["breakdown"]["verify"].values()) for s in steps]
    assert share[1] > share[0] and "recurrent" in format_step(steps[1])     # per-row states grow with the rows
