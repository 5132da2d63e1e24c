"""A tiny random pair on disk (with a chat template), a `specpilot serve` server on it in a background
thread, and the offline `specpilot generate` outputs to compare the server's answers with (fp32, CPU)."""
import json

import pytest

from specpilot.cli import main
from specpilot.models.loading import load_pair, stop_ids_for
from specpilot.models.random_ckpt import write_pair
from specpilot.serve import BackgroundServer, make_served

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
MODEL = "tiny"


def tiny_pair_dirs(base, seed: int) -> tuple:
    """A random tiny-llama target + block-4 drafter; the target's tokenizer gets a chat template."""
    tdir, ddir = write_pair(base, "tiny-llama", layer_ids=[1, 2], block_size=4, seed=seed)
    (tdir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return tdir, ddir


def start_server(tdir, ddir, name: str = MODEL, max_batch: int = 4, max_model_len: int = 512,
                 shutdown_grace_s: float = 30.0, **kw) -> BackgroundServer:
    """kw: make_served's (kv_pages, block_size, ...)."""
    target, drafter, tok = load_pair(tdir, ddir, "cpu", "fp32")
    served = make_served(target, drafter, tok, name, stop_ids_for(target, tok), max_batch=max_batch,
                         max_model_len=max_model_len, **kw)
    return BackgroundServer(served, shutdown_grace_s=shutdown_grace_s).start()


def client(server: BackgroundServer, **kw):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=kw.pop("timeout", 120), **kw)


def offline_texts(tdir, ddir, rows: list, max_new_tokens: int, tmp_path, *extra) -> list:
    """`specpilot generate --prompts` on rows ({id, prompt} or {id, turns}), one at a time: the texts."""
    prompts, out = tmp_path / "offline_prompts.jsonl", tmp_path / "offline_out.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["generate", "--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts), "--device", "cpu",
               "--dtype", "fp32", "--max-new-tokens", str(max_new_tokens), "--output", str(out), *extra])
    assert rc == 0
    return [json.loads(line)["text"] for line in out.read_text().splitlines()]


def streamed_text(stream, kind: str) -> tuple:
    """(text, finish_reason, usage) of a streamed response."""
    text, finish, use = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            use = chunk.usage
        for choice in chunk.choices:
            piece = choice.text if kind == "completions" else choice.delta.content
            text.append(piece or "")
            finish = choice.finish_reason or finish
    return "".join(text), finish, use
