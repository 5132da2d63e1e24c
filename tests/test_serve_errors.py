"""`specpilot serve` on bad input: each gets OpenAI's error body with its status and a message naming the
problem, and a good request right after it succeeds (fp32, CPU, tiny random pair)."""
import json

import httpx
import pytest

from serve_helpers import MODEL, client, start_server, tiny_pair_dirs
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)

MAX_LEN = 96


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tdir, ddir = tiny_pair_dirs(tmp_path_factory.mktemp("serve_errors"), seed=5)
    s = start_server(tdir, ddir, max_batch=2, max_model_len=MAX_LEN)
    yield s
    s.stop()


def _good(path="/completions") -> dict:
    body = {"model": MODEL, "max_tokens": 3, "temperature": 0}
    return {**body, "messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {**body, "prompt": "ab"}


CASES = [
    # (id, method, path, body (dict, or raw str), status, param, message part)
    ("malformed-json", "POST", "/completions", '{"model": "tiny", "prompt": ', 400, None, "not valid JSON"),
    ("body-not-object", "POST", "/completions", "[1, 2]", 400, None, "must be a JSON object"),
    ("missing-model", "POST", "/completions", {"prompt": "x"}, 400, "model", "must provide a model"),
    ("unknown-model", "POST", "/completions", {**_good(), "model": "gpt-9"}, 404, "model", "'gpt-9' does not exist"),
    ("unknown-model-chat", "POST", "/chat/completions", {**_good("chat"), "model": "x"}, 404, "model", "does not exist"),
    ("prompt-too-long", "POST", "/completions", {**_good(), "prompt": "a" * MAX_LEN}, 400, "prompt",
     "maximum context length is 96 tokens"),
    ("completion-too-long", "POST", "/completions", {**_good(), "max_tokens": MAX_LEN}, 400, "prompt",
     "2 in the prompt, 96 in the completion"),
    ("max-tokens-zero", "POST", "/completions", {**_good(), "max_tokens": 0}, 400, "max_tokens", "integer >= 1"),
    ("max-tokens-string", "POST", "/completions", {**_good(), "max_tokens": "5"}, 400, "max_tokens", "integer >= 1"),
    ("max-completion-tokens-zero", "POST", "/chat/completions", {**_good("chat"), "max_tokens": None,
     "max_completion_tokens": 0}, 400, "max_completion_tokens", "integer >= 1"),
    ("negative-temperature", "POST", "/completions", {**_good(), "temperature": -0.5}, 400, "temperature", ">= 0"),
    ("temperature-string", "POST", "/completions", {**_good(), "temperature": "hot"}, 400, "temperature", "a number"),
    ("top-p-zero", "POST", "/completions", {**_good(), "top_p": 0}, 400, "top_p", "(0, 1]"),
    ("seed-float", "POST", "/completions", {**_good(), "seed": 1.5}, 400, "seed", "an integer"),
    ("stop-five", "POST", "/completions", {**_good(), "stop": list("abcde")}, 400, "stop", "at most 4"),
    ("stop-empty", "POST", "/completions", {**_good(), "stop": ""}, 400, "stop", "non-empty string"),
    ("n-2", "POST", "/completions", {**_good(), "n": 2}, 400, "n", "n=2 is not supported"),
    ("best-of", "POST", "/completions", {**_good(), "best_of": 3}, 400, "best_of", "best_of=3 is not supported"),
    ("logprobs", "POST", "/completions", {**_good(), "logprobs": 2}, 400, "logprobs", "logprobs=2 is not supported"),
    ("chat-logprobs", "POST", "/chat/completions", {**_good("chat"), "logprobs": True}, 400, "logprobs",
     "logprobs=True is not supported"),
    ("echo", "POST", "/completions", {**_good(), "echo": True}, 400, "echo", "echo=True is not supported"),
    ("logit-bias", "POST", "/completions", {**_good(), "logit_bias": {"5": 10}}, 400, "logit_bias", "not supported"),
    ("penalty", "POST", "/completions", {**_good(), "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ("tools", "POST", "/chat/completions", {**_good("chat"), "tools": [{"type": "function"}]}, 400, "tools",
     "not supported"),
    ("unknown-field", "POST", "/completions", {**_good(), "frobnicate": 1}, 400, "frobnicate",
     "unrecognized request argument(s): frobnicate"),
    ("stream-options-without-stream", "POST", "/completions", {**_good(), "stream_options": {"include_usage": True}},
     400, "stream_options", "with stream=true"),
    ("prompt-batch", "POST", "/completions", {**_good(), "prompt": ["a", "b"]}, 400, "prompt", "a batch of 2 prompts"),
    ("prompt-empty", "POST", "/completions", {**_good(), "prompt": ""}, 400, "prompt", "zero tokens"),
    ("prompt-bad-type", "POST", "/completions", {**_good(), "prompt": 7}, 400, "prompt", "a string or a list"),
    ("prompt-ids-out-of-vocab", "POST", "/completions", {**_good(), "prompt": [1, 320]}, 400, "prompt",
     "[320] are outside the vocab (size 320)"),
    ("messages-empty", "POST", "/chat/completions", {**_good("chat"), "messages": []}, 400, "messages", "non-empty"),
    ("message-bad-role", "POST", "/chat/completions", {**_good("chat"), "messages": [{"role": "robot", "content": "x"}]},
     400, "messages[0]", "role one of"),
    ("message-image", "POST", "/chat/completions", {**_good("chat"), "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages[0].content", "only text parts"),
    ("unknown-route", "POST", "/embeddings", {"model": MODEL, "input": "x"}, 404, None, "no such route"),
    ("wrong-method", "GET", "/completions", None, 405, None, "method not allowed"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_its_error_and_the_server_keeps_serving(server, case):
    _, method, path, body, status, param, part = case
    content = body if isinstance(body, str) else None if body is None else json.dumps(body)
    r = httpx.request(method, server.url + path, content=content, headers={"Content-Type": "application/json"},
                      timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert part in error["message"], error
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    good = client(server).completions.create(model=MODEL, prompt="ok", max_tokens=3, temperature=0)
    assert good.choices[0].finish_reason in ("stop", "length") and good.usage.completion_tokens >= 1


def test_the_openai_client_raises_the_right_exceptions(server):
    import openai

    c = client(server)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length") as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "z" * MAX_LEN}], max_tokens=2)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="n=3 is not supported"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2, n=3)
    assert c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                     temperature=0).choices[0].message.content is not None
