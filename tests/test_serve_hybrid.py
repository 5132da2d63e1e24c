"""`specpilot serve` on a hybrid recurrent target (a tiny random Qwen3.5-layout pair, fp32, CPU): answers
to requests in flight together (each with its own GDN state slot in the batched engine) equal offline
`specpilot generate`, one prompt at a time."""
from concurrent.futures import ThreadPoolExecutor

from serve_helpers import CHAT_TEMPLATE, MODEL, client, offline_texts, start_server
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.models.random_ckpt import write_pair

PROMPTS = [{"id": "a", "prompt": "def f(x):\n"}, {"id": "b", "prompt": "import os"}, {"id": "c", "prompt": "x = [1"},
           {"id": "d", "prompt": "class A:"}]
NEW = 12


def test_concurrent_completions_on_a_hybrid_equal_offline_generate(tmp_path):
    tdir, ddir = write_pair(tmp_path / "pair", "tiny-qwen3.5", layer_ids=[1, 2], block_size=4, seed=5)
    (tdir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    want = offline_texts(tdir, ddir, PROMPTS, NEW, tmp_path)
    server = start_server(tdir, ddir, max_batch=3)
    try:
        c = client(server)

        def complete(row):
            r = c.completions.create(model=MODEL, prompt=row["prompt"], max_tokens=NEW, temperature=0)
            return r.choices[0].text

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(complete, PROMPTS))
    finally:
        server.stop()
    assert got == want
    assert server.served.worker.engine.recurrent is not None
