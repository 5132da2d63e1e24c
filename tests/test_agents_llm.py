"""The LLM proposer's protocol against a local OpenAI-compatible server started by the test.
The server returns canned replies (an unusable one, then a kernel edit): this checks parsing,
re-asking, token accounting and caps, never the quality of any LLM."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("openai")

from specpilot.agents.candidates import gemv_candidate  # noqa: E402
from specpilot.agents.proposers import ProposalContext  # noqa: E402
from specpilot.agents.proposers.llm import LLMProposer  # noqa: E402
from specpilot.kernels.variants.split12_gemv_cuda import GemvParams, render  # noqa: E402

EDIT = render(GemvParams(64, 2, 2, 2)).replace("// reduce the TPR", "// edited: reduce the TPR")


class _Server:
    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body})
                content = outer.replies.pop(0) if outer.replies else "{}"
                reply = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def _ctx(shape=(4096, 4096)):
    inc = gemv_candidate(shape, {}, "incumbent", "cuda")
    return ProposalContext("split12_gemv", shape, "cuda", 0, 1, 1, 0, inc, 50e-6, 5e-6,
                           [(inc, True, 50e-6, "")])


def test_llm_proposer_reasks_then_parses_a_kernel_edit():
    good = json.dumps({"rationale": "more rows in flight", "threads_per_row": 64, "rows_per_block": 2, "source": EDIT})
    server = _Server(["I think you should unroll more.", "```json\n" + good + "\n```"])
    try:
        p = LLMProposer(server.url, "canned-test-model", token_budget=10_000)
        (cand,) = p.propose(_ctx())
    finally:
        server.close()
    assert cand.source == EDIT and cand.kind == "cuda" and cand.proposer == "llm:canned-test-model"
    assert cand.params["threads_per_row"] == 64 and cand.params["rows_per_block"] == 2
    assert p.calls == 2 and p.tokens_used == 300
    first, second = server.requests
    assert first["path"].endswith("/chat/completions") and first["body"]["model"] == "canned-test-model"
    assert "extern \"C\" __global__ void split12_gemv" in first["body"]["messages"][0]["content"]
    assert "not usable" in second["body"]["messages"][-1]["content"]


def test_llm_proposer_rejects_contract_breaks_and_respects_the_token_budget():
    bad_geometry = json.dumps({"threads_per_row": 48, "rows_per_block": 1, "source": EDIT})
    wrong_name = json.dumps({"threads_per_row": 32, "rows_per_block": 1, "source": EDIT.replace("split12_gemv(", "gemv(")})
    server = _Server([bad_geometry, wrong_name, bad_geometry])
    try:
        p = LLMProposer(server.url, "m", token_budget=10_000, max_attempts=3)
        assert p.propose(_ctx()) == []
        assert p.calls == 3
        capped = LLMProposer(server.url, "m", token_budget=150, max_attempts=3)
        assert capped.propose(_ctx()) == [] and capped.calls == 1 and capped.exhausted
        priced = LLMProposer(server.url, "m", usd_per_mtok=2000.0, usd_budget=0.25, max_attempts=3)
        assert priced.propose(_ctx()) == [] and priced.calls == 1 and priced.usd_spent == pytest.approx(0.3)
    finally:
        server.close()


def test_llm_proposer_needs_an_endpoint():
    with pytest.raises(ValueError, match="base URL"):
        LLMProposer("", "m")


def test_loop_with_an_llm_agent_records_its_proposal(tmp_path, monkeypatch):
    from agents_helpers import tiny_target

    from specpilot.agents.loop import LoopConfig, run_optimize
    from specpilot.agents.memory import Memory

    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    good = json.dumps({"rationale": "r", "threads_per_row": 64, "rows_per_block": 2, "source": EDIT})
    server = _Server([good])
    try:
        cfg = LoopConfig(target_dir=str(tiny_target(tmp_path / "t")), ops=("split12_gemv",), rounds=1, agents=2,
                         per_agent=1, memory_url=str(tmp_path / "m.sqlite"), timer={"kind": "fake"},
                         shapes=[("o", 64, 64, 1)], llm={"base_url": server.url, "model": "canned"})
        summary = run_optimize(cfg, forcer=None, log=lambda m: None)
    finally:
        server.close()
    rows = Memory(str(tmp_path / "m.sqlite")).verdict_rows(summary["run_id"])
    llm = [r for r in rows if r["proposer"] == "llm:canned"]
    # on the CPU a CUDA edit cannot run: judged and recorded as such, never counted
    assert llm and not llm[0]["passed"] and "needs a GPU" in llm[0]["reason"]
    assert any(r["proposer"] == "builtin" and r["passed"] for r in rows)


class _StrictServer(_Server):
    """Rejects max_tokens the way newer OpenAI models do (400, asking for max_completion_tokens)."""

    def __init__(self, replies):
        super().__init__(replies)
        handler = self.httpd.RequestHandlerClass
        outer, ok_post = self, handler.do_POST

        def do_POST(h):
            length = int(h.headers["Content-Length"])
            raw = h.rfile.read(length)
            body = json.loads(raw)
            if "max_tokens" in body:
                outer.requests.append({"path": h.path, "body": body})
                err = json.dumps({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with "
                                            "this model. Use 'max_completion_tokens' instead.",
                                            "type": "invalid_request_error", "param": "max_tokens"}}).encode()
                h.send_response(400)
                h.send_header("Content-Type", "application/json")
                h.send_header("Content-Length", str(len(err)))
                h.end_headers()
                h.wfile.write(err)
                return
            import io

            h.rfile = io.BytesIO(raw)
            ok_post(h)
        handler.do_POST = do_POST


def test_llm_proposer_switches_to_max_completion_tokens_when_max_tokens_is_rejected():
    good = json.dumps({"rationale": "r", "threads_per_row": 64, "rows_per_block": 2, "source": EDIT})
    server = _StrictServer([good])
    try:
        p = LLMProposer(server.url, "strict-model", token_budget=10_000, max_retries=0)
        (cand,) = p.propose(_ctx())
    finally:
        server.close()
    assert cand.source == EDIT and p.token_param == "max_completion_tokens"
    assert "max_tokens" in server.requests[0]["body"] and server.requests[1]["body"]["max_completion_tokens"] == 4096


def test_unreachable_llm_endpoint_falls_back_to_the_builtin_proposer_with_one_message(tmp_path, monkeypatch):
    from agents_helpers import tiny_target

    from specpilot.agents.loop import LoopConfig, run_optimize
    from specpilot.agents.memory import Memory

    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    logs = []
    cfg = LoopConfig(target_dir=str(tiny_target(tmp_path / "t")), ops=("split12_gemv",), rounds=2, agents=2,
                     per_agent=1, memory_url=str(tmp_path / "m.sqlite"), timer={"kind": "fake"},
                     shapes=[("o", 64, 64, 1)], llm={"base_url": "http://127.0.0.1:9/v1", "model": "gone"})
    summary = run_optimize(cfg, forcer=None, log=logs.append)
    unavailable = [line for line in logs if "LLM proposer unavailable" in line]
    assert len(unavailable) == 1 and "APIConnectionError" in unavailable[0], logs
    rounds = Memory(str(tmp_path / "m.sqlite")).rounds(summary["run_id"])
    assert [r["status"] for r in rounds] == ["done", "done"]


def test_missing_openai_package_falls_back_with_one_message(monkeypatch):
    import builtins

    from specpilot.agents.loop import FallbackProposer

    real_import = builtins.__import__

    def no_openai(name, *args, **kwargs):
        if name == "openai":
            raise ImportError("No module named 'openai'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_openai)
    logs = []
    p = FallbackProposer(lambda: LLMProposer("http://127.0.0.1:9/v1", "m"), logs.append)
    ctx = _ctx((64, 64))
    ctx.device = "cpu"
    assert p.llm is None and len(logs) == 1 and "`openai` package is not installed" in logs[0]
    assert p.propose(ctx) and len(logs) == 1
