"""bench/serve_load.py on the CPU (random:tiny-llama, fp32): both paths run, the HTTP clients run in their
own process, every answer through HTTP equals the in-process engine's, and the report has the ratio."""
import json

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)

pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.mark.slow
def test_serve_load_http_vs_in_process(tmp_path, capsys):
    from specpilot.bench.serve_load import main

    data = tmp_path / "data"
    data.mkdir()
    for name in ("alpha", "beta"):
        (data / f"{name}.jsonl").write_text("".join(json.dumps({"id": f"{name}{i}", "turns": [f"{name} {i} " * (i + 1)]})
                                                    + "\n" for i in range(5)))
    out = tmp_path / "out"
    assert main(["--target", "random:tiny-llama", "--concurrency", "4", "--datasets", str(data),
                 "--benchmarks", "alpha,beta", "--limit", "5", "--max-new-tokens", "12", "--device", "cpu",
                 "--dtype", "fp32", "--out", str(out)]) == 0
    report = json.loads((out / "serve_load.json").read_text())
    assert report["prompts"] == 10 and report["concurrency"] == 4
    assert report["http"]["tokens"] == report["in_process"]["tokens"] == 10 * 12     # no stop token: all run to max
    assert report["identical_answers"] == 10
    assert report["http_over_in_process"] == pytest.approx(report["http"]["tokens_per_s"]
                                                           / report["in_process"]["tokens_per_s"])
    assert "identical answers 10/10" in capsys.readouterr().out
