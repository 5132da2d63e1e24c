"""Drafter kind detection from config.json, the random writers of every kind, and the session loop
(engine/spec_session.py) with the DFlash drafter behind it: identical to run_spec."""
import json

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from drafter_helpers import KindPair
from specpilot.engine.replay import GREEDY
from specpilot.engine.spec import run_spec
from specpilot.engine.spec_session import run_spec_session
from specpilot.models.config import read_config_json
from specpilot.models.drafters.kinds import KINDS, detect_kind


@pytest.mark.parametrize("kind", KINDS)
def test_written_pairs_are_detected_and_load(tmp_path, kind):
    pair = KindPair(tmp_path, kind, seed=3)
    assert detect_kind(read_config_json(pair.drafter_dir)) == kind
    assert getattr(pair.drafter, "kind", "dflash") == kind
    prompt = pair.prompt(7)
    assert pair.engine.generate_spec(prompt, 12).tokens == pair.engine.generate_ar(prompt, 12).tokens


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="cannot tell the drafter kind"):
        detect_kind({"architectures": ["MysteryDrafter"]})
    with pytest.raises(ValueError, match="must say DFlash2DraftModel"):
        detect_kind({"architectures": ["DFlashDraftModel"], "dflash_config": {"selector_rank": 4}})


def test_detects_published_layouts():
    assert detect_kind({"architectures": ["Qwen3ForCausalLM"], "pard_token": 151669}) == "pard"
    assert detect_kind({"architectures": ["Qwen3DSparkModel"], "markov_rank": 256}) == "dspark"
    assert detect_kind({"architectures": ["DFlash2DraftModel"], "dflash_config": {}}) == "dflash2"
    assert detect_kind({"architectures": ["DFlashDraftModel"], "dflash_config": {}}) == "dflash"


@pytest.fixture(scope="module")
def dflash_pair(tmp_path_factory):
    from drafter_helpers import accepting_pair

    return accepting_pair(lambda: tmp_path_factory.mktemp("dflash"), "dflash")


@pytest.mark.parametrize("block_size", [2, 5, 8])
def test_session_loop_with_dflash_equals_run_spec(dflash_pair, block_size):
    e = dflash_pair.engine
    longest = 0
    for prompt in dflash_pair.prompts(block_size, 9):     # the probe too at the drafter's block: drafts accepted
        ids = e.check_request(prompt, 23, 0.0)
        for temperature, seed in ((0.0, None), (0.9, 11)):
            with torch.inference_mode():
                a = run_spec(e, ids, 23, (), temperature, block_size, GREEDY, e.generator(seed))
                b = run_spec_session(e, ids, 23, (), temperature, block_size, GREEDY, e.generator(seed))
            assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths
            longest = max([longest, *a.acceptance_lengths])
    assert block_size != e.drafter.block_size or longest > 2


def test_random_checkpoint_cli_writes_each_kind(tmp_path):
    from specpilot.bench.random_checkpoint import main

    for kind in KINDS:
        assert main(["--preset", "tiny-qwen3", "--drafter-kind", kind, "--out", str(tmp_path / kind),
                     "--dtype", "fp32", "--block-size", "4"]) == 0
        assert detect_kind(json.loads((tmp_path / kind / "drafter" / "config.json").read_text())) == kind


@pytest.mark.parametrize("kind", ["dflash2", "dspark", "pard"])
def test_random_target_with_a_drafter_kind_runs_replayed(kind):
    """bench's in-memory scale tier: random:<preset>:<layers>:<kind>, acceptance replayed."""
    from specpilot.bench import random_pair
    from specpilot.engine.replay import AcceptanceReplay

    target = f"random:tiny-qwen3:2:{kind}"
    assert random_pair.kind(target) == kind and random_pair.parse(target) == ("tiny-qwen3", 2)
    block = random_pair.default_block_size(target)
    engine = random_pair.engine(target, "cpu", torch.float32, block, 256, False, True)
    assert engine.drafter.kind == kind and engine.drafter.block_size == block
    prompt = list(range(40, 52))
    ar = engine.generate_ar(prompt, 24).tokens
    assert engine.generate_spec(prompt, 24).tokens == ar
    replayed = engine.generate_spec(prompt, 24, replay=AcceptanceReplay(ar, 3.0))
    assert replayed.tokens == ar and replayed.replay_shortfalls == 0
    assert replayed.acceptance_lengths[:6] == [3] * 6
    with pytest.raises(ValueError, match="drafter kind 'eagle'"):
        random_pair.parse("random:tiny-qwen3:2:eagle")
