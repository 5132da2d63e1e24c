"""Planted broken engines: the verdict (token_force, and `specpilot verify` end to end) must FAIL each,
and PASS the same engine unbroken. Each fault goes in where the real loop runs: the greedy policy's
accepted count (engine/replay.GreedyAcceptance.accepted), the new-token rule and the commit of
engine/accept.py as engine/spec.py binds them (both the stepwise run_spec and the graphed
run_spec_graphed, which the CPU runs by default), and the drafter's context injection
(DFlashDrafter.write_context, both loops), so generate_spec -> run_spec -> accept / commit is the path
broken, as the CLI runs it. CPU, fp32.

The tiny random pair's drafts are never right (tau 1), so a fault that needs accepted drafts (a commit
that drops the last accepted one) is planted there with an oracle drafter: the honest transcript's
next tokens are put on top of the drafter's logits, which changes drafts only, never what a lossless
engine outputs. The zoo pair (skipped when absent) has a trained drafter; a stale draft context
changes its acceptance, not its output, which fp32 runs judge (stock's acceptance lengths)."""
import dataclasses
import json

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed
from specpilot import settings
from specpilot.cli import main
from specpilot.engine import accept, spec
from specpilot.engine.engine import Engine
from specpilot.engine.replay import GreedyAcceptance
from specpilot.models.drafter import DFlashDrafter
from specpilot.verify.forcing import token_force


def accept_all(self, step, verify_size, matched):
    return verify_size - 1


def accept_one_too_many(self, step, verify_size, matched):
    return min(matched + 1, verify_size - 1)


def wrong_bonus(block, posterior, accepted):
    return list(block[1:accepted + 1]) + [posterior[accepted - 1]]    # one row early (none accepted: the last)


def drops_last_accepted(new, room, stop, tokens):
    return accept.commit(new[:-2] + new[-1:] if len(new) > 1 else new, room, stop, tokens)


def host_control(monkeypatch, engines=()) -> None:
    """`engines` and every engine built from here on run the graphed loop with the host's control (early launch off):
    with early launch the device advances each step's control itself and the loop's own check stops a
    host that disagrees (a RuntimeError, "fused spec step ran at position ..."), so a host-side fault
    would never reach the output."""
    real_init = Engine.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.config = dataclasses.replace(self.config, early_launch=False)

    monkeypatch.setattr(Engine, "__init__", init)
    for engine in engines:
        monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, early_launch=False))


def plant(monkeypatch, fault: str, engines=()) -> None:
    """Breaks `engines` and every engine built from here on (both loops) with the named fault."""
    if fault == "stale_context":
        _plant_stale_context(monkeypatch)
        return
    host_control(monkeypatch, engines)
    if fault in ("accept_all", "accept_one_too_many"):
        monkeypatch.setattr(GreedyAcceptance, "accepted", {"accept_all": accept_all,
                                                           "accept_one_too_many": accept_one_too_many}[fault])
    elif fault == "wrong_bonus":
        monkeypatch.setattr(spec, "new_tokens", wrong_bonus)
    else:
        monkeypatch.setattr(spec, "commit", drops_last_accepted)


def _plant_stale_context(monkeypatch):
    """Each context injection writes the previous injection's features (the previous step's) instead
    of its own, at its own positions."""
    real, previous = DFlashDrafter.write_context, {}

    def stale(self, features, positions, cache):
        last, previous[id(self)] = previous.get(id(self)), features.clone()
        if last is not None:
            reused = torch.zeros_like(features)
            rows = min(last.shape[1], features.shape[1])
            reused[:, :rows] = last[:, :rows]
            features = reused
        return real(self, features, positions, cache)

    monkeypatch.setattr(DFlashDrafter, "write_context", stale)


def plant_oracle_drafter(monkeypatch, sequence):
    """Drafts = the honest transcript's tokens at the block's positions (prompt + greedy output)."""
    real = DFlashDrafter.forward_block

    def oracle(self, block_ids, positions, cache, kv_len, last_visible=None):
        logits = real(self, block_ids, positions, cache, kv_len, last_visible)     # [1, T-1, V]
        for i, p in enumerate(positions.reshape(-1)[1:].tolist()):
            if p < len(sequence):
                logits[0, i, sequence[p]] = logits[0, i].max() + 1
        return logits

    monkeypatch.setattr(DFlashDrafter, "forward_block", oracle)


TINY_FAULTS = ["accept_all", "accept_one_too_many", "wrong_bonus", "drops_last_accepted"]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    # tiny-llama: its random outputs vary more than tiny-qwen3's (often one token repeated, where a
    # dropped token can leave the output as it was)
    return Pair(tmp_path_factory.mktemp("planted"), "tiny-llama", [1, 2], block_size=8, seed=fresh_seed())


def varied_prompt(pair):
    """Of four random prompts, the one whose greedy output has the most distinct tokens."""
    prompts = [pair.random_prompt(8) for _ in range(4)]
    return max(prompts, key=lambda p: len(set(pair.engine.generate_ar(p, NEW_TOKENS).tokens)))


CLI_TEXTS = ["def add(a, b):\n    return", "import os\nimport sys\n", "class Stack:\n    def push(self, x):",
             "for i in range(10):\n", "x = [1, 2, 3]\ny =", "hello world, this is"]


@pytest.fixture(scope="module")
def cli_prompts(pair, tmp_path_factory):
    """A one-prompt file for the CLI: of CLI_TEXTS, the one whose greedy output varies most."""
    from specpilot.models import load_tokenizer
    from specpilot.models.prompts import Prompt, encode_prompt

    tok = load_tokenizer(pair.target_dir)
    text = max(CLI_TEXTS, key=lambda t: len(set(pair.engine.generate_ar(
        encode_prompt(tok, Prompt(id="p", text=t)), NEW_TOKENS).tokens)))
    path = tmp_path_factory.mktemp("planted_prompts") / "prompts.jsonl"
    path.write_text(json.dumps({"id": "p", "prompt": text}) + "\n")
    return path


def assert_honest(summary: dict, fault: str) -> None:
    """The unbroken engine passes; with the oracle drafter its output is still stock's and AR's (the
    drafts change no output), but its acceptance lengths are the oracle's, not stock's drafter's, so
    the fp32 acceptance check is its one reason to fail."""
    assert summary["mismatches"] == summary["spec_mismatches"] == summary["excused"] == 0, summary
    if fault == "drops_last_accepted":
        assert summary["spec_identical"] == summary["ar_identical"] == 1 and summary["acceptance_mismatches"] == 1
        assert len(summary["reasons"]) == 1 and "acceptance lengths" in summary["reasons"][0], summary["reasons"]
    else:
        assert summary["passed"] and summary["reasons"] == [], summary["reasons"]


def _oracle_if_needed(monkeypatch, pair, fault, prompt):
    if fault == "drops_last_accepted":           # needs accepted drafts: the random drafter has none
        plant_oracle_drafter(monkeypatch, prompt + pair.engine.generate_ar(prompt, NEW_TOKENS).tokens)


@pytest.mark.parametrize("loop", ["fused", "stepwise"])
@pytest.mark.parametrize("fault", TINY_FAULTS)
def test_token_force_fails_each_planted_fault(pair, fault, loop, monkeypatch):
    monkeypatch.setattr(pair.engine, "config", dataclasses.replace(pair.engine.config, fused_steps=loop == "fused"))
    prompt = varied_prompt(pair)
    honest_ar = pair.engine.generate_ar(prompt, NEW_TOKENS).tokens
    _oracle_if_needed(monkeypatch, pair, fault, prompt)
    honest = token_force(pair.engine, pair.stock, [prompt], NEW_TOKENS)
    assert_honest(honest.summary(), fault)
    if fault == "drops_last_accepted":
        assert honest.per_prompt[0]["our_tau"] > 1.5, honest.per_prompt    # drafts are accepted
    plant(monkeypatch, fault, [pair.engine])
    assert pair.engine.generate_spec(prompt, NEW_TOKENS).tokens != honest_ar, f"{fault} changed nothing"
    bad = token_force(pair.engine, pair.stock, [prompt], NEW_TOKENS)
    assert not bad.passed and bad.spec_mismatches > 0, bad.summary()
    assert bad.mismatches == 0                                # the forced paths run no accept rule
    assert {m["check"] for m in bad.spec_mismatch_list} >= {"spec-vs-stock", "spec-vs-ar"}
    assert all(m["margin"] >= m["threshold"] for m in bad.spec_mismatch_list)


@pytest.mark.parametrize("fault", TINY_FAULTS)
def test_cli_verify_fails_each_planted_fault(pair, cli_prompts, fault, monkeypatch, capsys):
    from specpilot.models import load_tokenizer
    from specpilot.models.prompts import Prompt, encode_prompt

    args = ["verify", "--target", str(pair.target_dir), "--drafter", str(pair.drafter_dir), "--prompts",
            str(cli_prompts), "--max-new-tokens", str(NEW_TOKENS), "--device", "cpu", "--dtype", "fp32"]
    text = json.loads(cli_prompts.read_text())["prompt"]
    prompt = encode_prompt(load_tokenizer(pair.target_dir), Prompt(id="p", text=text))
    _oracle_if_needed(monkeypatch, pair, fault, prompt)
    main(args)
    honest = capsys.readouterr().out.strip().splitlines()
    assert_honest(json.loads(honest[-1]), fault)
    assert honest[-2].startswith("verdict: PASS" if fault != "drops_last_accepted" else "verdict: FAIL: 1 prompts"), \
        honest[-2]
    plant(monkeypatch, fault, [pair.engine])
    assert pair.engine.generate_spec(prompt, NEW_TOKENS).tokens != pair.engine.generate_ar(prompt, NEW_TOKENS).tokens, \
        f"{fault} changed nothing on this prompt"
    rc = main(args)
    printed = capsys.readouterr().out
    lines = printed.strip().splitlines()
    out = json.loads(lines[-1])
    assert rc == 1 and out["passed"] is False and out["spec_mismatches"] > 0, printed[-3000:]
    assert lines[-2].startswith("verdict: FAIL: ") and "speculative output" in lines[-2], lines[-2]
    assert out["spec_identical"] == 0


# -- the zoo pair: a trained drafter, so every fault bites without an oracle ----------------------

ZOO_FAULTS = TINY_FAULTS + ["stale_context"]
zoo = pytest.mark.skipif(settings.zoo_pair() is None, reason="the zoo pair (SPECPILOT_ZOO) is not present")


@pytest.fixture(scope="module")
def zoo_setup():
    from specpilot.engine import Engine
    from specpilot.models import load_drafter, load_target, load_tokenizer
    from specpilot.models.prompts import encode_prompt, read_prompts
    from specpilot.verify.referee import load_referee
    from specpilot.verify.stock import load_stock

    tdir, ddir = settings.zoo_pair()
    target = load_target(tdir, dtype=torch.float32)
    engine = Engine(target, load_drafter(ddir, target), max_seq_len=512)
    rows = read_prompts(tdir.parent / "prompts" / "pystdlib.jsonl", limit=40)
    tok = load_tokenizer(tdir)
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(fresh_seed())).tolist()
    # A random prompt on which the drafter is accepted (tau > 1.5 over 48 tokens), so that every planted
    # fault has accepted drafts to break; some prompts accept almost nothing.
    for pick in order[:8]:
        prompt = encode_prompt(tok, rows[pick])[-96:]
        if engine.generate_spec(prompt, 48).tau > 1.5:
            break
    return engine, load_stock(tdir, ddir, "cpu", torch.float32), load_referee(tdir, torch.float32), prompt


@zoo
@pytest.mark.parametrize("fault", ZOO_FAULTS)
def test_zoo_pair_token_force_fails_each_planted_fault(zoo_setup, fault, monkeypatch):
    engine, stock, referee, prompt = zoo_setup
    stop = ()                                                  # 48 tokens whatever the prompt
    honest = engine.generate_spec(prompt, 48, stop_ids=stop)
    assert honest.tau > 1.5, honest.acceptance_lengths        # the trained drafter is accepted
    plant(monkeypatch, fault, [engine])
    broken = engine.generate_spec(prompt, 48, stop_ids=stop)
    assert (broken.tokens, broken.acceptance_lengths) != (honest.tokens, honest.acceptance_lengths), fault
    bad = token_force(engine, stock, [prompt], 48, stop_ids=stop, referee=referee)
    assert not bad.passed, bad.summary()
    if fault == "stale_context":                              # lossless still: only the acceptance moved
        assert bad.spec_mismatches == 0 and bad.acceptance_mismatches == 1 and bad.acceptance_judged
    else:
        assert bad.spec_mismatches > 0


@zoo
def test_zoo_pair_cli_verify_passes_honest_and_fails_a_stale_draft_context(tmp_path, monkeypatch, capsys):
    tdir, ddir = settings.zoo_pair()
    first = json.loads((tdir.parent / "prompts" / "pystdlib.jsonl").read_text().splitlines()[0])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": first["id"], "prompt": first["prompt"][:400]}) + "\n")
    args = ["verify", "--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts),
            "--max-new-tokens", "48", "--device", "cpu", "--dtype", "fp32"]
    assert main(args) == 0, capsys.readouterr().out[-3000:]
    honest = capsys.readouterr().out.strip().splitlines()
    assert honest[-2].startswith("verdict: PASS") and json.loads(honest[-1])["acceptance_mismatches"] == 0
    plant(monkeypatch, "stale_context")
    assert main(args) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("verdict: FAIL: ") and "acceptance lengths" in lines[-2], lines[-2]


def test_cli_verify_with_early_launch_stops_a_host_side_fault(pair, cli_prompts, monkeypatch, capsys):
    """The CLI's default loop (fused, early launch): the device advances each step itself, so a host
    accept rule that disagrees is caught by the loop's own check and verify exits with the error."""
    monkeypatch.setattr(GreedyAcceptance, "accepted", accept_all)     # early launch stays on (the default)
    rc = main(["verify", "--target", str(pair.target_dir), "--drafter", str(pair.drafter_dir), "--prompts",
               str(cli_prompts), "--max-new-tokens", str(NEW_TOKENS), "--device", "cpu", "--dtype", "fp32"])
    assert rc == 2 and "fused spec step ran at position" in capsys.readouterr().err
