"""`specpilot serve` on the zoo's trained pair (code-tiny + its DFlash drafter, fp32 CPU) through the
`openai` client: real multi-token acceptance (tau > 1 in /metrics), completions and chat (the zoo's
pass-through chat template), streamed and not, equal to offline `specpilot generate`. Skipped without
the zoo."""
import json
import urllib.request

import pytest

from serve_helpers import client, offline_texts, streamed_text
from specpilot import settings
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)

ZOO = settings.get().zoo            # $SPECPILOT_ZOO or ../shared/zoo
TARGET, DRAFTER = ZOO / "code-tiny", ZOO / "code-tiny-dflash-b16"
NEW = 48


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    if not (TARGET / "config.json").exists() or not (DRAFTER / "config.json").exists():
        pytest.skip(f"the zoo pair is not at {ZOO}")
    from specpilot.models.loading import load_pair, stop_ids_for
    from specpilot.serve import BackgroundServer, make_served

    rows = [json.loads(line) for line in (ZOO / "prompts" / "humaneval.jsonl").read_text().splitlines()[:5]]
    rows += [{"id": "chat", "turns": [rows[0]["prompt"]]}]
    want = offline_texts(TARGET, DRAFTER, rows, NEW, tmp_path_factory.mktemp("zoo_offline"))
    target, drafter, tok = load_pair(TARGET, DRAFTER, "cpu", "fp32")
    server = BackgroundServer(make_served(target, drafter, tok, "code-tiny", stop_ids_for(target, tok), max_batch=4,
                                          max_model_len=1024)).start()
    yield server, rows, want
    server.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_zoo_completions_and_chat_equal_offline(zoo, stream):
    server, rows, want = zoo
    c = client(server)
    assert sum(bool(t.strip()) for t in want) >= 2, "the zoo pair answers most prompts with code"
    for row, expected in zip(rows, want):
        if "turns" in row:
            kw = dict(model="code-tiny", messages=[{"role": "user", "content": row["turns"][0]}], max_tokens=NEW,
                      temperature=0)
            text = (streamed_text(c.chat.completions.create(stream=True, **kw), "chat")[0] if stream
                    else c.chat.completions.create(**kw).choices[0].message.content)
        else:
            kw = dict(model="code-tiny", prompt=row["prompt"], max_tokens=NEW, temperature=0)
            text = (streamed_text(c.completions.create(stream=True, **kw), "completions")[0] if stream
                    else c.completions.create(**kw).choices[0].text)
        assert text == expected, row["id"]
    metrics = urllib.request.urlopen(server.url[:-len("/v1")] + "/metrics").read().decode()
    tau = float(next(line.split()[1] for line in metrics.splitlines() if line.startswith("specpilot_tau ")))
    assert tau > 1.3, f"the trained pair accepts drafts (tau {tau})"
