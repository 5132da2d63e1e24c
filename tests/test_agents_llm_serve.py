"""The agents' LLM proposer against a real `specpilot serve` (tiny random pair, fp32 CPU): its chat requests
go through the server's chat template and engine, it receives the generated text, the gate's parser
rejects it (a random model writes no kernel), it re-asks with the problem stated until max_attempts, and
its token accounting equals what the server served. The proposal path with a usable reply is
tests/test_agents_llm.py's (canned replies)."""
from dataclasses import replace

import pytest

from serve_helpers import CHAT_TEMPLATE, start_server
from test_agents_llm import _ctx
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.agents.proposers.llm import LLMProposer, parse_reply
from specpilot.models.random_ckpt import TARGET_PRESETS, write_pair


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The proposer's prompt is ~3k bytes (the contract and the kernel source): positions for it in bytes.
    cfg = replace(TARGET_PRESETS["tiny-llama"], max_position_embeddings=8192)
    tdir, ddir = write_pair(tmp_path_factory.mktemp("agents_serve"), cfg, layer_ids=[1, 2], block_size=4, seed=3)
    (tdir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    s = start_server(tdir, ddir, name="served-proposer", max_batch=2, max_model_len=6144)
    yield s
    s.stop()


def test_llm_proposer_round_trips_through_the_server(server):
    p = LLMProposer(server.url, "served-proposer", max_tokens=12, token_budget=1_000_000, max_attempts=3,
                    max_retries=0, timeout_s=120)
    replies = []
    create = p._create

    def recording(messages):
        resp = create(messages)
        replies.append((messages, resp))
        return resp

    p._create = recording
    assert p.propose(_ctx()) == []                     # three unusable replies: no proposal
    assert p.calls == 3 == len(replies)
    metrics = server.served.metrics
    assert p.tokens_used == metrics.prompt_tokens + metrics.generated_tokens
    for i, (messages, resp) in enumerate(replies):
        text = resp.choices[0].message.content
        assert resp.model == "served-proposer" and resp.object == "chat.completion"
        assert resp.usage.completion_tokens == 12 or resp.choices[0].finish_reason == "stop"
        with pytest.raises(ValueError):                 # what the proposer's gate said about it
            parse_reply(text, "split12_gemv", (4096, 4096), p.name)
        if i:                                           # the re-ask carries the previous reply and the problem
            assert messages[-2] == {"role": "assistant", "content": replies[i - 1][1].choices[0].message.content}
            assert "That reply was not usable" in messages[-1]["content"]
    # The prompt the server counted is the chat template over the proposer's messages.
    assert replies[0][1].usage.prompt_tokens == len(server.served.tokenizer.apply_chat_template(
        replies[0][0], add_generation_prompt=True, tokenize=True)["input_ids"])
