"""`specpilot serve` as a command: started in a subprocess on a free port, queried with the README's
client example (run as written, on that port), stopped with SIGTERM (the shutdown logged); bad options get a clear error."""
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from serve_helpers import streamed_text, tiny_pair_dirs
from specpilot.cli import main
from specpilot.serve.server import free_port

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return tiny_pair_dirs(tmp_path_factory.mktemp("serve_cli"), seed=13)


def readme_client_example() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    return re.search(r"## Serving.*?```py\n(.*?)```", text, flags=re.S).group(1)


def _wait_healthy(url: str, proc, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            return json.loads(urllib.request.urlopen(url + "/health", timeout=2).read())
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the server did not come up")


def test_serve_command_answers_and_stops_on_sigterm(dirs):
    tdir, ddir = dirs
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "specpilot", "serve", "--target", str(tdir), "--drafter", str(ddir),
                             "--port", str(port), "--device", "cpu", "--dtype", "fp32", "--threads", "1",
                             "--served-model-name", "code-tiny", "--max-model-len", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert _wait_healthy(f"http://127.0.0.1:{port}", proc)["status"] == "ok"
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):         # the README's client example, as written
            exec(compile(readme_client_example().replace("127.0.0.1:8000", f"127.0.0.1:{port}"), "README", "exec"), {})
        assert "CompletionUsage(completion_tokens=" in printed.getvalue()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        _, finish, _ = streamed_text(client.chat.completions.create(
            model="code-tiny", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=8, temperature=0,
            stream=True), "chat")
        assert finish in ("stop", "length")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    # uvicorn re-raises the signal once its graceful shutdown is done (older versions exit 0)
    assert proc.returncode in (0, -signal.SIGTERM), err[-2000:]
    assert "shutdown: 0 request(s) in flight" in err
    assert "shutdown: 0 request(s) finished, 0 cancelled, 0 failed; engine stopped" in err


@pytest.mark.parametrize("extra, message", [
    (["--port", "0"], "--port 0 must be in 1..65535"),
    (["--max-batch", "0"], "--max-batch 0 must be >= 1"),
    (["--max-model-len", "99999"], "--max-model-len 99999 must be an int in 2..2048"),
    (["--max-model-len", "256", "--kv-pages", "8"], "--kv-pages 8 holds 128 tokens, fewer than --max-model-len 256"),
    (["--block-size", "9"], "--block-size 9: the drafter was trained for blocks of 4"),
])
def test_serve_command_refuses_bad_options(dirs, capsys, extra, message):
    tdir, ddir = dirs
    rc = main(["serve", "--target", str(tdir), "--drafter", str(ddir), "--device", "cpu", "--dtype", "fp32", *extra])
    assert rc == 2
    assert message in capsys.readouterr().err
