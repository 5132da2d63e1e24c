"""What the CLI prints around the work: tqdm bars only on a terminal, bold only on a terminal, our
warnings as one line (split12 weights on the CPU), bad input as one line and a device failure with its
traceback."""
import io
import sys
import warnings

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot import progress as progress_mod
from specpilot.cli import main


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_tqdm_on_a_terminal_and_nothing_when_piped(monkeypatch):
    items = [1, 2, 3]
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_mod.progress(items, desc="x") is items        # piped: the very same iterable
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    bar = progress_mod.progress(items, desc="loading", unit="tensor")
    assert type(bar).__name__ == "tqdm" and list(bar) == items
    assert "loading" in term.getvalue()


def test_bold_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert progress_mod.bold("x") == "x"
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert progress_mod.bold("x") == "\033[1mx\033[0m"


@pytest.fixture(scope="module")
def packed_pair(tmp_path_factory):
    import torch

    from specpilot.models.random_ckpt import write_pair

    base = tmp_path_factory.mktemp("s12")
    t, d = write_pair(base, "tiny-qwen3", layer_ids=[0, 2], block_size=4, seed=fresh_seed(), dtype=torch.bfloat16)
    assert main(["pack", str(t), str(base / "packed")]) == 0
    return base / "packed", d


def test_split12_on_the_cpu_warns_once_in_one_line(packed_pair):
    from specpilot.models import load_target
    from specpilot.models.loading import SlowPathWarning

    packed, _ = packed_pair
    with pytest.warns(SlowPathWarning, match="split12 weights on the CPU run about 15x slower than bf16"):
        load_target(packed, device="cpu", dtype="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                           # bf16 weights of the same folder: no warning
        load_target(packed, device="cpu", dtype="bf16", weights="bf16")
    import os
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1"}            # the CLI as a user runs it, piped
    run = subprocess.run([sys.executable, "-m", "specpilot", "generate", "--target", str(packed), "--ar", "--prompt",
                          "x", "--max-new-tokens", "2", "--device", "cpu", "--dtype", "bf16"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.splitlines() == [
        "specpilot: warning: split12 weights on the CPU run about 15x slower than bf16 (each call decodes the "
        "12-bit planes; the packed format pays off on a GPU only); the same folder with weights='bf16' "
        "(--weights bf16) gives the same tokens"]
    assert "\033[" not in run.stdout + run.stderr


def test_other_warnings_keep_pythons_format():
    from specpilot.cli import plain_specpilot_warnings

    plain_specpilot_warnings()
    plain_specpilot_warnings()                                   # idempotent
    text = warnings.formatwarning("m", UserWarning, "f.py", 3)
    assert text.startswith("f.py:3: UserWarning: m")


def test_bench_progress_is_a_bar_on_a_terminal_and_lines_when_piped(monkeypatch):
    from specpilot.bench.live_progress import LiveProgress

    rows = [{"benchmark": "gsm8k", "method": "our_spec", "new_tokens": 10, "time_per_token_s": 0.05,
             "acceptance_lengths": [3, 2]}]
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    progress = LiveProgress()
    progress("gsm8k", 1, 2, 0, rows)
    assert piped.getvalue().startswith("[gsm8k 1/2] our_spec")
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    progress("gsm8k", 1, 2, 0, rows)
    progress("gsm8k", 2, 2, 0, rows)
    progress.close()
    shown = term.getvalue()
    assert "gsm8k" in shown and "2/2" in shown and "our_spec" in shown and "[gsm8k" not in shown


def test_bad_input_is_one_line_and_a_device_failure_keeps_its_traceback(monkeypatch, capsys):
    import torch
    from specpilot.commands import env

    def fail_with(error):
        def run(args):
            raise error
        monkeypatch.setattr(env, "run", run)

    fail_with(ValueError("--prompts x.jsonl: no such file"))
    assert main(["env"]) == 2
    assert capsys.readouterr().err == "specpilot env: error: --prompts x.jsonl: no such file\n"
    fail_with(torch.AcceleratorError("CUDA error: operation failed due to a previous error during capture"))
    with pytest.raises(torch.AcceleratorError, match="during capture"):
        main(["env"])
    wrapped = RuntimeError("capturing the batched engine's target graph (32, 12, 512) failed")
    wrapped.__cause__ = torch.AcceleratorError("CUDA error: operation not permitted when stream is capturing")
    fail_with(wrapped)
    with pytest.raises(RuntimeError, match=r"target graph \(32, 12, 512\)"):
        main(["env"])
