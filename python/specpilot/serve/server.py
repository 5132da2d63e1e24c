"""Assembling a server (engine, worker, app) and running it with uvicorn, in the foreground (the CLI)
or in a background thread (tests, bench/serve_load.py)."""
from __future__ import annotations

import logging
import socket
import threading
import time

from specpilot.engine.batch import BatchConfig, BatchEngine

from .app import Served, build_app
from .metrics import Metrics
from .worker import EngineWorker

DEFAULT_MAX_MODEL_LEN = 4096
log = logging.getLogger("specpilot.serve")


def make_served(target, drafter, tokenizer, model_name: str, stop_ids=(), max_batch: int = 8,
                max_model_len: int | None = None, kv_pages: int | None = None, block_size: int | None = None,
                config: BatchConfig = BatchConfig()) -> Served:
    """max_model_len: the longest prompt + completion one request may have (default: the target's
    positions, at most DEFAULT_MAX_MODEL_LEN); kv_pages: the engine's page pool (default: room for
    max_batch requests of max_model_len at once)."""
    positions = target.config.max_position_embeddings
    if max_model_len is None:
        max_model_len = min(positions, DEFAULT_MAX_MODEL_LEN)
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or not 2 <= max_model_len <= positions:
        raise ValueError(f"--max-model-len {max_model_len!r} must be an int in 2..{positions} (the target's positions)")
    per_request = -(-max_model_len // config.page_size)
    kv_pages = max_batch * per_request if kv_pages is None else kv_pages
    if kv_pages < per_request:
        raise ValueError(f"--kv-pages {kv_pages} holds {kv_pages * config.page_size} tokens, fewer than "
                         f"--max-model-len {max_model_len}: raise --kv-pages or lower --max-model-len")
    engine = BatchEngine(target, drafter, config, max_batch=max_batch, kv_pages=kv_pages, block_size=block_size)
    t0 = time.perf_counter()
    if engine.eager_reason:
        log.info("%s", engine.eager_reason)
    graphs = engine.warmup(max_model_len)          # every decode graph before the first request (CUDA)
    if graphs:
        log.info("captured %d CUDA graphs of the decode steps (batch sizes up to %d, %d positions) in %.1f s",
                 graphs, max_batch, max_model_len, time.perf_counter() - t0)
    metrics = Metrics()
    return Served(EngineWorker(engine, metrics), tokenizer, model_name, tuple(stop_ids), max_model_len,
                  target.config.vocab_size, metrics)


def uvicorn_config(served: Served, host: str, port: int, shutdown_grace_s: float = 30.0, log_level: str = "info"):
    import uvicorn

    app = build_app(served, shutdown_grace_s)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          timeout_graceful_shutdown=shutdown_grace_s)


def make_server(served: Served, host: str, port: int, shutdown_grace_s: float = 30.0, log_level: str = "info"):
    """A uvicorn Server that tells the engine worker when shutdown begins (new requests get 503, the
    in-flight count is logged); uvicorn then drains the connections for shutdown_grace_s, cancels what
    is left (each handler cancels its engine request) and the app's lifespan stops the engine."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            served.worker.begin_shutdown(shutdown_grace_s)
            await super().shutdown(sockets)

    return Server(uvicorn_config(served, host, port, shutdown_grace_s, log_level))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """A uvicorn server in a daemon thread on host:port (a free port when 0); `with` starts and stops it."""

    def __init__(self, served: Served, host: str = "127.0.0.1", port: int = 0, shutdown_grace_s: float = 30.0,
                 log_level: str = "warning"):
        self.served, self.host = served, host
        self.port = port or free_port(host)
        self.server = make_server(served, host, self.port, shutdown_grace_s, log_level)
        self.thread = threading.Thread(target=self.server.run, name="specpilot-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 60.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
