"""`specpilot serve` through the real `openai` client on a tiny random pair (fp32, CPU): completions and
chat, streamed and not, equal to offline `specpilot generate`; stop strings, seeds, usage, /metrics."""
import json
import urllib.request

import pytest

from serve_helpers import MODEL, client, offline_texts, start_server, streamed_text, tiny_pair_dirs
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)

PROMPTS = [{"id": "a", "prompt": "def f(x):\n"}, {"id": "b", "prompt": "import os"}, {"id": "c", "prompt": "x"}]
CHATS = [{"id": "u", "turns": ["hello there"]}, {"id": "v", "turns": ["write a loop"]}]
NEW = 14


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tdir, ddir = tiny_pair_dirs(tmp_path_factory.mktemp("serve_api"), seed=11)
    server = start_server(tdir, ddir)
    yield tdir, ddir, server
    server.stop()


@pytest.fixture(scope="module")
def offline(setup, tmp_path_factory):
    tdir, ddir, _ = setup
    tmp = tmp_path_factory.mktemp("offline")
    return offline_texts(tdir, ddir, PROMPTS, NEW, tmp), offline_texts(tdir, ddir, CHATS, NEW, tmp)


def test_models_lists_the_served_name(setup):
    models = client(setup[2]).models.list()
    assert [m.id for m in models.data] == [MODEL]


@pytest.mark.parametrize("stream", [False, True])
def test_completions_equal_offline_generate(setup, offline, stream):
    c = client(setup[2])
    for row, want in zip(PROMPTS, offline[0]):
        kw = dict(model=MODEL, prompt=row["prompt"], max_tokens=NEW, temperature=0)
        if stream:
            text, finish, use = streamed_text(c.completions.create(stream=True, stream_options={"include_usage": True},
                                                                   **kw), "completions")
        else:
            r = c.completions.create(**kw)
            text, finish, use = r.choices[0].text, r.choices[0].finish_reason, r.usage
        assert text == want, row
        assert finish in ("stop", "length")
        assert use.prompt_tokens == len(row["prompt"].encode()) and 1 <= use.completion_tokens <= NEW
        assert use.total_tokens == use.prompt_tokens + use.completion_tokens
        assert (finish == "length") == (use.completion_tokens == NEW)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_offline_generate_through_the_chat_template(setup, offline, stream):
    c = client(setup[2])
    for row, want in zip(CHATS, offline[1]):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": row["turns"][0]}], max_tokens=NEW,
                  temperature=0)
        if stream:
            text, finish, _ = streamed_text(c.chat.completions.create(stream=True, **kw), "chat")
        else:
            r = c.chat.completions.create(**kw)
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
            assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
        assert text == want, row
        assert finish in ("stop", "length")


def test_token_id_prompt_equals_text_prompt(setup, offline):
    from specpilot.models.loading import load_tokenizer

    ids = load_tokenizer(setup[0]).encode(PROMPTS[0]["prompt"], add_special_tokens=False)
    r = client(setup[2]).completions.create(model=MODEL, prompt=ids, max_tokens=NEW, temperature=0)
    assert r.choices[0].text == offline[0][0]


def _stop_string(text: str) -> tuple:
    """A 2-character printable ASCII stop string inside `text` (not at its start) and the text before it."""
    for i in range(1, len(text) - 1):
        s = text[i:i + 2]
        if all(32 <= ord(ch) < 127 for ch in s):
            return s, text[:text.find(s)]
    pytest.skip(f"no printable 2-character stop string in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_text_before_it(setup, offline, stream):
    c = client(setup[2])
    full = max(offline[0], key=len)
    row = PROMPTS[offline[0].index(full)]
    stop, want = _stop_string(full)
    kw = dict(model=MODEL, prompt=row["prompt"], max_tokens=NEW, temperature=0, stop=[stop, "\x00never"])
    if stream:
        text, finish, _ = streamed_text(c.completions.create(stream=True, **kw), "completions")
    else:
        r = c.completions.create(**kw)
        text, finish = r.choices[0].text, r.choices[0].finish_reason
    assert (text, finish) == (want, "stop")


def test_seeded_sampling_repeats_and_equals_offline(setup, offline, tmp_path):
    tdir, ddir, server = setup
    c = client(server)
    kw = dict(model=MODEL, prompt=PROMPTS[0]["prompt"], max_tokens=NEW, temperature=0.9, top_p=1.0, seed=1234)
    first = c.completions.create(**kw).choices[0].text
    again = c.completions.create(**kw).choices[0].text
    want = offline_texts(tdir, ddir, PROMPTS[:1], NEW, tmp_path, "--temperature", "0.9", "--seed", "1234")[0]
    assert first == again == want


def test_health_and_metrics_count_what_was_served(setup):
    c = client(setup[2])
    c.completions.create(model=MODEL, prompt="abc", max_tokens=3, temperature=0)
    base = setup[2].url[:-len("/v1")]
    health = json.loads(urllib.request.urlopen(base + "/health").read())
    assert health["status"] == "ok"
    with urllib.request.urlopen(base + "/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples['specpilot_requests_total{outcome="ok"}'] >= 1
    assert samples["specpilot_generation_tokens_total"] >= 3 and samples["specpilot_prompt_tokens_total"] >= 3
    assert samples["specpilot_tau"] >= 1.0 and samples["specpilot_verify_steps_total"] >= 1
    assert samples["specpilot_step_seconds_count"] >= 1
    assert samples['specpilot_step_seconds_bucket{le="+Inf"}'] == samples["specpilot_step_seconds_count"]
    assert samples['specpilot_http_responses_total{endpoint="/v1/completions",code="200"}'] >= 1
    for gauge in ("specpilot_queue_depth", "specpilot_batch_size"):
        assert gauge in samples
    for name, kind in [("specpilot_requests_total", "counter"), ("specpilot_tau", "gauge"),
                       ("specpilot_step_seconds", "histogram")]:
        assert f"# TYPE {name} {kind}\n" in text
