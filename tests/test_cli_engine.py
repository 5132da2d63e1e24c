"""`specpilot generate / verify` end to end on a tiny random pair (fp32, CPU); the demo: test_cli_demo.py."""
import json

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.cli import main
from specpilot.models.random_ckpt import write_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    t, d = write_pair(base, "tiny-llama", layer_ids=[1, 2], block_size=4, seed=fresh_seed())
    prompts = base / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "prompt": "def f(x):\n"}, {"id": "b", "turns": ["hello there", "second turn"]},
        {"id": "c", "prompt": "import os"}]) + "\n")
    return t, d, prompts


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def test_verify_json_line(pair, capsys):
    t, d, prompts = pair
    rc = main(["verify", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--limit", "2",
               "--max-new-tokens", "12", "--device", "cpu", "--dtype", "fp32"])
    printed = capsys.readouterr().out
    out = last_json(printed)
    assert rc == 0 and out["passed"] is True and out["reasons"] == [], printed[-4000:]
    assert out["prompts"] == 2 and out["mismatches"] == out["spec_mismatches"] == out["excused"] == 0
    assert 2 <= out["tokens"] <= 24 and out["spec_identical"] == out["ar_identical"] == 2
    assert out["referee"] == "fp64" and out["referee_k"] == 4.0 and 0 < out["noise"] < 1e-4
    assert printed.strip().splitlines()[-2].startswith("verdict: PASS: 2 prompts")


def test_verify_bf16_with_its_fp32_referee_on_the_host(pair, capsys):
    """A bf16 engine is refereed by the fp32 twin (on the CPU here); the JSON line names it, the
    noise it measured, and every side's error against it."""
    t, d, prompts = pair
    main(["verify", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--limit", "1",
          "--max-new-tokens", "8", "--device", "cpu", "--dtype", "bf16", "--referee-device", "cpu"])
    printed = capsys.readouterr().out
    out = last_json(printed)
    assert out["referee"] == "fp32" and "on cpu" in out["referee_note"] and out["prompts"] == 1
    assert list(out["referee_error"]) == ["stock", "prefill", "decode", "verify"]
    assert all(e["positions"] == out["tokens"] for e in out["referee_error"].values())
    assert out["noise"] == max(e["rms_error"] for e in out["referee_error"].values())
    assert "fp32 referee: excused iff margin < max(4 x noise" in printed
    assert printed.strip().splitlines()[-2].startswith("verdict: PASS" if out["passed"] else "verdict: FAIL: ")


def test_verify_without_a_referee_says_so(pair, capsys):
    t, d, prompts = pair
    rc = main(["verify", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--limit", "1",
               "--max-new-tokens", "8", "--device", "cpu", "--dtype", "fp32", "--referee", "none"])
    printed = capsys.readouterr().out
    out = last_json(printed)
    assert rc == 0 and out["passed"] is True and out["referee"] == "none" and out["noise"] is None
    assert "--referee none" in out["referee_note"] and "NOTE: no referee scored this run" in printed


def test_generate_spec_and_ar_agree(pair, capsys):
    t, d, _ = pair
    common = ["--target", str(t), "--prompt", "x = 1\n", "--max-new-tokens", "10", "--device", "cpu", "--dtype", "fp32"]
    assert main(["generate", "--drafter", str(d), *common]) == 0
    spec = capsys.readouterr().out
    assert main(["generate", "--ar", *common]) == 0
    ar = capsys.readouterr().out
    assert last_json(spec)["mode"] == "spec" and last_json(ar)["mode"] == "ar"
    assert last_json(spec)["tokens"] == last_json(ar)["tokens"] >= 1
    text = lambda out: out.split("=== prompt ===\n")[1].split("\n--- prompt")[0]
    assert text(spec) == text(ar)                    # greedy spec decoding == AR


def test_generate_errors(pair, capsys):
    t, d, prompts = pair
    assert main(["generate", "--target", str(t), "--prompt", "x", "--device", "cpu"]) == 2
    assert "--drafter" in capsys.readouterr().err
    assert main(["generate", "--target", str(t), "--ar", "--prompts", str(prompts) + ".missing", "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err
    for command in ("generate", "verify"):     # the pair's drafter drafts blocks of 4
        source = ["--prompt", "x"] if command == "generate" else ["--prompts", str(prompts)]
        assert main([command, "--target", str(t), "--drafter", str(d), *source, "--block-size", "64",
                     "--device", "cpu", "--dtype", "fp32"]) == 2
        assert "--block-size 64: the drafter was trained for blocks of 4; use 1..4" in capsys.readouterr().err


def test_split12_folder_as_target(tmp_path, capsys):
    """A `specpilot pack`ed target runs as split12 by default (stock reads a bf16 unpack of it) and
    token-forces against stock; --weights bf16 runs the same folder unpacked, with the same tokens."""
    import torch

    from specpilot.formats.split12.linear import Split12Linear
    from specpilot.models import load_target

    t, d = write_pair(tmp_path, "tiny-qwen3", layer_ids=[0, 2], block_size=4, seed=fresh_seed(),
                      dtype=torch.bfloat16)
    packed = tmp_path / "target-split12"
    assert main(["pack", str(t), str(packed)]) == 0
    capsys.readouterr()
    assert any(isinstance(m, Split12Linear) for m in load_target(packed).modules())
    assert not any(isinstance(m, Split12Linear) for m in load_target(packed, weights="bf16").modules())
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "def f(x):\n"}) + "\n")
    rc = main(["verify", "--target", str(packed), "--drafter", str(d), "--prompts", str(prompts),
               "--max-new-tokens", "12", "--device", "cpu", "--dtype", "bf16"])
    out = last_json(capsys.readouterr().out)
    assert rc == 0 and out["passed"] is True and out["prompts"] == 1 and out["tokens"] >= 1
    assert out["weights"] == "split12"
    runs = {}
    for mode, weights in (("--drafter", None), ("--ar", None), ("--ar", "bf16")):
        args = ["generate", "--target", str(packed), "--prompt", "x = 1\n", "--max-new-tokens", "10",
                "--device", "cpu", "--dtype", "bf16"] + ([mode, str(d)] if mode == "--drafter" else [mode])
        assert main(args + (["--weights", weights] if weights else [])) == 0
        out = capsys.readouterr().out
        runs[mode, weights] = (last_json(out)["weights"], out.split("=== prompt ===\n")[1].split("\n--- prompt")[0])
    assert runs["--drafter", None][0] == runs["--ar", None][0] == "split12" and runs["--ar", "bf16"][0] == "bf16"
    assert runs["--drafter", None][1] == runs["--ar", None][1]  # greedy spec == AR on split12 weights


def test_verify_piped_prints_no_progress_bars(pair):
    """A piped run (no terminal) prints no Hugging Face "Loading weights" bars; the verdict still ends it."""
    import os
    import subprocess
    import sys

    t, d, prompts = pair
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-m", "specpilot", "verify", "--target", str(t), "--drafter", str(d),
                           "--prompts", str(prompts), "--limit", "1", "--max-new-tokens", "6", "--device", "cpu",
                           "--dtype", "fp32"], capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"},
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Loading weights" not in done.stderr and "it/s]" not in done.stderr, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-2].startswith("verdict: PASS")
