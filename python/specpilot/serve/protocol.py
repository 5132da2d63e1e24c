"""OpenAI request bodies -> (prompt ids, Sampling), every bad input an APIError in OpenAI's error format;
and the response / chunk bodies.

Supported: model, prompt (one string or one list of token ids) / messages (system, user, assistant,
developer; string content or text parts), max_tokens (max_completion_tokens on chat), temperature,
top_p, seed, stop (a string or up to 4), stream, stream_options.include_usage, user (ignored).
Refused by name: n > 1, best_of > 1, logprobs, top_logprobs, echo, suffix, logit_bias, presence /
frequency penalties, tools and functions, response formats other than text, and any unknown field.
"""
from __future__ import annotations

import json
import numbers
import time
import uuid
from dataclasses import dataclass

COMPLETION_DEFAULT_MAX_TOKENS = 16           # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple
    stream: bool
    include_usage: bool


def _is_default(value, *defaults) -> bool:
    return value is None or any(value is d or (type(value) is type(d) and value == d) for d in defaults)


# Parameters this server cannot honour (they would change what is sampled or returned): refused by name
# unless they carry their no-op value.
_UNSUPPORTED = {
    "n": lambda v: _is_default(v, 1),
    "best_of": lambda v: _is_default(v, 1),
    "logprobs": lambda v: _is_default(v, False, 0),
    "top_logprobs": lambda v: _is_default(v, 0),
    "echo": lambda v: _is_default(v, False),
    "suffix": lambda v: v is None,
    "logit_bias": lambda v: v is None or v == {},
    "presence_penalty": lambda v: _is_default(v, 0, 0.0),
    "frequency_penalty": lambda v: _is_default(v, 0, 0.0),
    "tools": lambda v: v is None or v == [],
    "tool_choice": lambda v: _is_default(v, "none"),
    "parallel_tool_calls": lambda v: True,
    "functions": lambda v: v is None or v == [],
    "function_call": lambda v: _is_default(v, "none"),
    "response_format": lambda v: v is None or v == {"type": "text"},
}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "user"}
_KNOWN = {"completions": _COMMON | {"prompt"}, "chat": _COMMON | {"messages", "max_completion_tokens"}}
CHAT_ROLES = ("system", "user", "assistant", "developer")


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is None:
        raise APIError(400, "you must provide a model parameter", param="model")
    if model != served:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {served!r}", param="model",
                       code="model_not_found")


def check_params(body: dict, kind: str) -> None:
    for name, ok in _UNSUPPORTED.items():
        if name in body and not ok(body[name]):
            raise APIError(400, f"{name}={body[name]!r} is not supported by this server (supported: "
                                f"{', '.join(sorted(_KNOWN[kind]))})", param=name, code="unsupported_parameter")
    unknown = sorted(set(body) - _KNOWN[kind] - set(_UNSUPPORTED))
    if unknown:
        raise APIError(400, f"unrecognized request argument(s): {', '.join(unknown)}", param=unknown[0],
                       code="unsupported_parameter")


def completion_prompt(body: dict, tokenizer, vocab_size: int) -> list:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                               # a batch of one
    if isinstance(prompt, str):
        ids = [int(i) for i in tokenizer.encode(prompt, add_special_tokens=False)]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise APIError(400, f"prompt token ids {bad[:5]} are outside the vocab (size {vocab_size})",
                           param="prompt")
        ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError(400, f"a batch of {len(prompt)} prompts is not supported: send one request per prompt",
                       param="prompt", code="unsupported_parameter")
    else:
        raise APIError(400, "prompt must be a string or a list of token ids", param="prompt")
    if not ids:
        raise APIError(400, "the prompt encodes to zero tokens", param="prompt")
    return ids


def chat_prompt(body: dict, tokenizer) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
            raise APIError(400, f"messages[{i}] must be an object with role one of {', '.join(CHAT_ROLES)}",
                           param=f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):
            texts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None for p in content]
            if not all(isinstance(t, str) for t in texts):
                raise APIError(400, f"messages[{i}].content: only text parts are supported",
                               param=f"messages[{i}].content", code="unsupported_parameter")
            content = "".join(texts)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string or a list of text parts",
                           param=f"messages[{i}].content")
        plain.append({"role": m["role"], "content": content})
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions", param="messages")
    ids = tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    ids = [int(i) for i in ids]
    if not ids:
        raise APIError(400, "the messages encode to zero tokens", param="messages")
    return ids


def sampling(body: dict, kind: str, prompt_len: int, max_model_len: int) -> Sampling:
    max_tokens = body.get("max_tokens")
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        if max_tokens is not None and max_tokens != body["max_completion_tokens"]:
            raise APIError(400, "give max_tokens or max_completion_tokens, not both", param="max_completion_tokens")
        max_tokens = body["max_completion_tokens"]
    param = "max_completion_tokens" if kind == "chat" and "max_completion_tokens" in body else "max_tokens"
    if max_tokens is None:
        max_tokens = COMPLETION_DEFAULT_MAX_TOKENS if kind == "completions" else max(max_model_len - prompt_len, 1)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise APIError(400, f"{param}={max_tokens!r} must be an integer >= 1", param=param)
    if prompt_len + max_tokens > max_model_len:
        raise APIError(400, f"this model's maximum context length is {max_model_len} tokens, but you requested "
                            f"{prompt_len + max_tokens} ({prompt_len} in the prompt, {max_tokens} in the completion)",
                       param="messages" if kind == "chat" else "prompt", code="context_length_exceeded")
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise APIError(400, f"temperature={temperature} must be >= 0", param="temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise APIError(400, f"top_p={top_p} must be in (0, 1]", param="top_p")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise APIError(400, f"seed={seed!r} must be an integer", param="seed")
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if (not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise APIError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them",
                       param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise APIError(400, f"stream={stream!r} must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise APIError(400, "stream_options is only {include_usage: bool}, with stream=true", param="stream_options")
    return Sampling(max_tokens, temperature, top_p, seed, tuple(stop), bool(stream),
                    bool((options or {}).get("include_usage", False)))


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise APIError(400, f"{name}={value!r} must be a number", param=name)
    return float(value)


# -- responses ---------------------------------------------------------------------------------------
def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(kind: str, rid: str, model: str, text: str, finish: str, use: dict) -> dict:
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice], "usage": use}


def chunk(kind: str, rid: str, model: str, text: str | None, finish: str | None, first: bool = False,
          use: dict | None = None) -> dict:
    """One streamed chunk; text None with `use`: the usage-only chunk (no choices)."""
    if text is None and use is not None:
        choices = []
    elif kind == "chat":
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
    out = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
           "created": int(time.time()), "model": model, "choices": choices}
    if use is not None:
        out["usage"] = use
    return out
