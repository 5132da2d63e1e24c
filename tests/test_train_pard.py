"""scripts/train_pard.py's one-pass PARD objective: with its attention mask, each pard row's logits
equal a separate forward of [context up to the anchor, pard x i] (what inference runs), each corpus
row's equal the plain causal forward, and the labels are the next corpus tokens; the drafter it
initialises from the zoo-shaped target loads in our engine as a PARD drafter."""
import importlib.util
import json
from pathlib import Path

import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.models.random_ckpt import write_pair

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_pard.py"


def _script():
    spec = importlib.util.spec_from_file_location("train_pard", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_masked_pass_equals_inference_forwards(tmp_path):
    train_pard = _script()
    tdir, _ = write_pair(tmp_path, "tiny-qwen3", layer_ids=[0, 2], seed=4)
    k, pard = 4, 319
    model, copied = train_pard.drafter_from_target(tdir, layers=2, k=k, pard_token=pard, device="cpu")
    assert copied > 0 and model.config.pard_token == pard and model.config.pard_draft_k == k
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 318, (2, 20 + k), generator=g)
    anchors = [3, 11, 19]
    ids, positions, mask, labels = train_pard.pard_batch(windows, anchors, k, pard)
    additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=positions[None].expand(2, -1),
                       attention_mask=additive[None, None]).logits
        plain = model(input_ids=windows[:, :20]).logits
        torch.testing.assert_close(logits[:, :20], plain, rtol=1e-5, atol=1e-5)
        assert torch.equal(labels[:, :20], windows[:, 1:21])
        for j, a in enumerate(anchors):
            for i in range(1, k):
                row = 20 + j * (k - 1) + i - 1
                alone = model(input_ids=torch.cat([windows[:, :a + 1], torch.full((2, i), pard)], dim=1)).logits
                torch.testing.assert_close(logits[:, row], alone[:, -1], rtol=1e-5, atol=1e-5)
                assert torch.equal(labels[:, row], windows[:, a + 1 + i])


def test_saved_drafter_loads_as_pard(tmp_path):
    from specpilot.engine import Engine
    from specpilot.models import load_drafter, load_target

    train_pard = _script()
    tdir, _ = write_pair(tmp_path, "tiny-qwen3", layer_ids=[0, 2], seed=5)
    model, _ = train_pard.drafter_from_target(tdir, layers=2, k=5, pard_token=319, device="cpu")
    model.save_pretrained(str(tmp_path / "pard"))
    assert json.loads((tmp_path / "pard" / "config.json").read_text())["pard_token"] == 319
    target = load_target(tdir, dtype=torch.float32)
    drafter = load_drafter(tmp_path / "pard", target)
    assert drafter.kind == "pard" and drafter.block_size == 6
    engine = Engine(target, drafter, max_seq_len=256)
    prompt = list(range(20, 31))
    assert engine.generate_spec(prompt, 16).tokens == engine.generate_ar(prompt, 16).tokens
