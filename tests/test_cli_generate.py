"""`specpilot generate` as a user meets it: streaming (the engine's on_tokens callback), --threads, the
CPU defaults, defaults in -h, --max-new-tokens against the model's positions, a clean Ctrl-C."""
import io
import json

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.cli import main
from specpilot.config import EngineConfig
from specpilot.engine import Engine
from specpilot.engine.text_stream import TextStream
from specpilot.models import load_pair
from specpilot.models.random_ckpt import write_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("gen")
    return write_pair(base, "tiny-qwen3", layer_ids=[0, 2], block_size=4, seed=fresh_seed())


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def body(out, pid="prompt"):
    return out.split(f"=== {pid} ===\n")[1].split(f"\n--- {pid}")[0]


def test_text_stream_writes_exactly_the_decoded_text_across_split_characters(pair):
    """The byte tokenizer splits "é", "中" and an emoji over several tokens: nothing half-written, and
    what is written in any chunking equals decode(all tokens)."""
    _, _, tok = load_pair(*pair, device="cpu", dtype="fp32")
    ids = tok.encode("def f(x):\n    return 'é中🙂'\n\nprint(f(1))  # done")
    assert len(ids) > len("def f(x):\n    return 'é中🙂'\n\nprint(f(1))  # done")   # multi-byte splits
    for chunk in (1, 2, 3, 7):
        out = io.StringIO()
        stream = TextStream(tok, out)
        seen = []
        for i in range(0, len(ids), chunk):
            stream(ids[i:i + chunk])
            seen.append(out.getvalue())
        stream.finish()
        assert out.getvalue() == tok.decode(ids) == stream.text
        assert stream.tokens == ids
        assert not any("\ufffd" in s for s in seen)                  # never a half character on screen


@pytest.mark.parametrize("fused", [True, False])
def test_on_tokens_sees_every_token_once_in_order(pair, fused):
    target, drafter, tok = load_pair(*pair, device="cpu", dtype="fp32")
    engine = Engine(target, drafter, max_seq_len=128, config=EngineConfig(fused_steps=fused))
    prompt = tok.encode("import os\n")
    for kwargs in ({}, {"temperature": 0.8, "seed": 3}):
        calls = {"ar": [], "spec": []}
        ar = engine.generate_ar(prompt, 20, on_tokens=calls["ar"].append, **kwargs)
        spec = engine.generate_spec(prompt, 20, on_tokens=calls["spec"].append, **kwargs)
        assert [t for c in calls["ar"] for t in c] == ar.tokens and all(len(c) == 1 for c in calls["ar"])
        assert [t for c in calls["spec"] for t in c] == spec.tokens
        assert [len(c) for c in calls["spec"]] == [1] + spec.acceptance_lengths   # prefill token, then each step


def test_stream_flag_prints_the_same_text_as_without(pair, capsys):
    t, d = pair
    common = ["generate", "--target", str(t), "--drafter", str(d), "--prompt", "x = 1\n", "--max-new-tokens", "12",
              "--device", "cpu"]
    assert main(common) == 0
    plain = capsys.readouterr().out
    assert main(common + ["--stream"]) == 0
    streamed = capsys.readouterr().out
    assert body(streamed) == body(plain) and last_json(streamed)["tokens"] == last_json(plain)["tokens"]
    assert 1 <= last_json(plain)["tokens"] <= 12                      # the random target's eos may stop both


def test_cpu_defaults_fp32_and_threads(pair, capsys, monkeypatch):
    import argparse

    from specpilot.engine.cli_support import apply_run_args

    args = argparse.Namespace(device="cpu", dtype=None, threads=1)
    apply_run_args(args)
    assert args.dtype == "fp32" and torch.get_num_threads() == 1
    args = argparse.Namespace(device="cuda", dtype=None, threads=1)
    apply_run_args(args)
    assert args.dtype == "bf16"
    t, _ = pair
    assert main(["generate", "--target", str(t), "--ar", "--prompt", "x", "--threads", "0", "--device", "cpu"]) == 2
    assert "--threads 0 must be >= 1" in capsys.readouterr().err
    import specpilot.commands.generate as gen_cmd

    seen = {}
    original = gen_cmd.load_pair

    def spy(target, drafter, device, dtype, weights):
        seen.update(dtype=dtype, threads=torch.get_num_threads())
        return original(target, drafter, device, dtype, weights)

    monkeypatch.setattr(gen_cmd, "load_pair", spy)
    assert main(["generate", "--target", str(t), "--ar", "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu",
                 "--threads", "2"]) == 0
    assert seen == {"dtype": "fp32", "threads": 2}
    torch.set_num_threads(1)


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "-h"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 256)" in text and "(default: 1)" in text and "(default: 0.0)" in text
    assert "fp32 on the CPU" in text and "(default: None)" not in text and "(default: False)" not in text


def test_max_new_tokens_past_the_models_positions_is_refused(pair, capsys):
    t, d = pair
    positions = json.loads((t / "config.json").read_text())["max_position_embeddings"]
    rc = main(["generate", "--target", str(t), "--drafter", str(d), "--prompt", "abc", "--max-new-tokens", "100000",
               "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert (f"--max-new-tokens 100000: prompt 'prompt' has 3 tokens and the model has {positions} positions "
            f"(max_position_embeddings); use --max-new-tokens {positions - 3} or less") in err
    assert main(["generate", "--target", str(t), "--ar", "--prompt", "abc", "--max-new-tokens", "0",
                 "--device", "cpu"]) == 2
    assert "--max-new-tokens 0 must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["spec", "ar"])
def test_ctrl_c_prints_what_was_generated_and_its_stats(pair, capsys, monkeypatch, mode):
    """Ctrl-C after the 5th token: the 5 tokens' text, an 'interrupted' stats line and JSON, status 130."""
    t, d = pair
    original = TextStream.__call__

    def interrupt_after_five(self, new_tokens):
        original(self, new_tokens)
        if len(self.tokens) >= 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(TextStream, "__call__", interrupt_after_five)
    source = ["--ar"] if mode == "ar" else ["--drafter", str(d)]
    rc = main(["generate", "--target", str(t), *source, "--prompt", "x = 1\n", "--max-new-tokens", "40",
               "--device", "cpu"])
    captured = capsys.readouterr()
    assert rc == 130 and "Traceback" not in captured.err + captured.out
    summary = last_json(captured.out)
    assert summary["interrupted"] is True and summary["prompts"] == 1 and 5 <= summary["tokens"] < 40
    assert "--- prompt: interrupted (Ctrl-C): prompt " in captured.out
    monkeypatch.undo()
    # the printed text is the greedy run's first tokens
    assert main(["generate", "--target", str(t), *source, "--prompt", "x = 1\n", "--max-new-tokens",
                 str(summary["tokens"]), "--device", "cpu"]) == 0
    assert body(capsys.readouterr().out) == body(captured.out)


def test_ctrl_c_while_loading_is_one_line(pair, capsys, monkeypatch):
    import specpilot.commands.generate as gen_cmd

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(gen_cmd, "load_pair", interrupted)
    rc = main(["generate", "--target", str(pair[0]), "--ar", "--prompt", "x", "--device", "cpu"])
    assert rc == 130 and capsys.readouterr().err.strip() == "specpilot generate: interrupted"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the graphed, early-launch loops")
@pytest.mark.parametrize("early_launch", [True, False])
def test_on_tokens_on_the_graphed_gpu_loops(early_launch):
    """The fused CUDA-graph loops (one step launched ahead) stream every token once, in order, and only
    tokens that were committed: the callback's tokens are the result's tokens."""
    from specpilot import embedded_pair

    target, drafter, tok = load_pair(*embedded_pair(), device="cuda", dtype="bf16")
    engine = Engine(target, drafter, max_seq_len=512, config=EngineConfig(early_launch=early_launch))
    engine.warmup()
    prompt = tok.encode("import os\n\n\ndef list_files(path):\n    ")
    stop = (tok.eos_token_id,)
    for generate in (engine.generate_ar, engine.generate_spec):
        calls = []
        result = generate(prompt, 200, stop, on_tokens=calls.append)
        assert [t for c in calls for t in c] == result.tokens
        if generate == engine.generate_spec:
            assert [len(c) for c in calls] == [1] + result.acceptance_lengths


def test_a_real_sigint_stops_generate_cleanly():
    """The process as a user runs it, sent SIGINT while it decodes: exit 130, the text so far, its stats."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from specpilot import embedded_pair

    target, drafter = embedded_pair()
    proc = subprocess.Popen([sys.executable, "-m", "specpilot", "generate", "--target", str(target), "--drafter",
                             str(drafter), "--prompt", "class Stack:", "--max-new-tokens", "2000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's
    assert proc.stdout.readline() == "=== prompt ===\n"         # decoding has started
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["interrupted"] is True and 1 <= summary["tokens"] < 2000
    stats = [line for line in out.splitlines() if line.startswith("--- prompt: interrupted (Ctrl-C): prompt ")]
    assert len(stats) == 1 and f" tokens, {summary['tokens']} new in " in stats[0]
