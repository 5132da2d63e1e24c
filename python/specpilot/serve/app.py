"""The ASGI app (Starlette): /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Each generation request becomes one engine Request on the EngineWorker; its handler awaits the
ticket's events, turns tokens into text (TextStream: stop strings) and answers in one JSON body or as
server-sent events. A client that goes away, or a stop string that matches, cancels the engine request
so its pages go back to the pool at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from specpilot.engine.batch import Request

from . import protocol
from .metrics import Metrics
from .protocol import APIError
from .text import TextStream
from .worker import EngineStopped, EngineWorker, Ticket

log = logging.getLogger("specpilot.serve")


@dataclass
class Served:
    worker: EngineWorker
    tokenizer: object
    model_name: str
    stop_ids: tuple
    max_model_len: int
    vocab_size: int
    metrics: Metrics
    created: int = field(default_factory=lambda: int(time.time()))


class SSEResponse(StreamingResponse):
    """Closes its event generator however the response ends (its `finally` cancels the engine request)."""

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


def build_app(served: Served, shutdown_grace_s: float = 30.0) -> Starlette:
    async def error(endpoint: str, e: APIError) -> JSONResponse:
        served.metrics.observe_http(endpoint, e.status)
        return JSONResponse(e.body(), status_code=e.status)

    async def models(request: HTTPRequest):
        served.metrics.observe_http("/v1/models", 200)
        return JSONResponse({"object": "list", "data": [{"id": served.model_name, "object": "model",
                                                         "created": served.created, "owned_by": "specpilot"}]})

    async def health(request: HTTPRequest):
        if served.worker.alive:
            return JSONResponse({"status": "ok", "in_flight": served.worker.in_flight})
        return JSONResponse({"status": "error", "reason": served.worker.failure or "stopped"}, status_code=503)

    async def metrics(request: HTTPRequest):
        return PlainTextResponse(served.metrics.render(), media_type="text/plain; version=0.0.4")

    async def generate(request: HTTPRequest, kind: str):
        endpoint = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        try:
            body = protocol.parse_json(await request.body())
            protocol.check_model(body, served.model_name)
            protocol.check_params(body, kind)
            tok = served.tokenizer
            if kind == "chat":
                ids = protocol.chat_prompt(body, tok)
            else:
                ids = protocol.completion_prompt(body, tok, served.vocab_size)
            params = protocol.sampling(body, kind, len(ids), served.max_model_len)
            ticket = Ticket(asyncio.get_running_loop())
            served.worker.submit(Request(tuple(ids), params.max_tokens, temperature=params.temperature,
                                         top_p=params.top_p, seed=params.seed, stop_ids=served.stop_ids), ticket)
        except APIError as e:
            return await error(endpoint, e)
        except EngineStopped as e:
            return await error(endpoint, APIError(503, f"not accepting requests: {e}", type="server_error",
                                                  code="unavailable"))
        job = Job(served, kind, ticket, ids, params)
        served.metrics.observe_http(endpoint, 200)
        if params.stream:
            return SSEResponse(job.events(), media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})
        try:
            return JSONResponse(await job.whole(request))
        except APIError as e:
            return await error(endpoint, e)

    async def completions(request: HTTPRequest):
        return await generate(request, "completions")

    async def chat(request: HTTPRequest):
        return await generate(request, "chat")

    async def not_found(request: HTTPRequest, exc):
        status = getattr(exc, "status_code", 404)
        what, code = ("no such route", "not_found") if status == 404 else ("method not allowed", "method_not_allowed")
        body = APIError(status, f"{request.method} {request.url.path}: {what}", code=code).body()
        return JSONResponse(body, status_code=status)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        served.worker.start()
        log.info("serving %s (max model length %d)", served.model_name, served.max_model_len)
        yield
        await asyncio.to_thread(served.worker.shutdown, shutdown_grace_s)

    routes = [Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})


class Job:
    """One generation request's life on the asyncio side."""

    def __init__(self, served: Served, kind: str, ticket: Ticket, ids: list, params):
        self.served, self.kind, self.ticket, self.params = served, kind, ticket, params
        self.prompt_len = len(ids)
        self.id = protocol.new_id(kind)
        self.text = TextStream(served.tokenizer, params.stop)
        self.finish: str | None = None           # "stop" / "length" once the request has ended

    async def pieces(self):
        """Yields text pieces until the request ends (sets self.finish); cancels the engine request if
        the consumer stops early."""
        try:
            while self.finish is None:
                kind, payload = await self.ticket.events.get()
                if kind == "tokens":
                    piece = self.text.add(payload)
                    if self.text.stopped:
                        self.served.worker.cancel(self.ticket)
                        self.finish = "stop"
                    if piece:
                        yield piece
                elif kind == "done":
                    if payload.error is not None and not self.text.stopped:
                        raise self._engine_error(payload.error)
                    self.finish = "stop" if payload.tokens and payload.tokens[-1] in self.served.stop_ids else "length"
                    rest = self.text.flush()
                    if rest:
                        yield rest
                else:                            # "failed": the engine thread died
                    raise APIError(500, payload, type="server_error", code="engine_failed")
        finally:
            if self.finish is None:
                self.served.worker.cancel(self.ticket)
                log.info("request %s cancelled before it finished (client gone or shutdown)", self.id)

    def _engine_error(self, message: str) -> APIError:
        if message == "cancelled":
            return APIError(503, "the request was cancelled: the server is shutting down", type="server_error",
                            code="cancelled")
        return APIError(400, f"the engine refused the request: {message}")

    def usage(self) -> dict:
        return protocol.usage(self.prompt_len, len(self.text.tokens))

    async def whole(self, request: HTTPRequest) -> dict:
        """The whole answer; a client that disconnects first cancels the engine request."""
        async def collect():
            pieces = self.pieces()
            try:
                return "".join([piece async for piece in pieces])
            finally:
                await pieces.aclose()

        work = asyncio.ensure_future(collect())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not work.done():
            work.cancel()                        # runs pieces()'s finally: the engine request is cancelled
            raise APIError(499, "client disconnected")
        text = work.result()
        return protocol.response(self.kind, self.id, self.served.model_name, text, self.finish, self.usage())

    async def events(self):
        """Server-sent events: the chunks, an optional usage chunk, then [DONE]."""
        name, first, pieces = self.served.model_name, True, self.pieces()
        try:
            if self.kind == "chat":
                yield _sse(protocol.chunk(self.kind, self.id, name, "", None, first=True))
                first = False
            async for piece in pieces:
                yield _sse(protocol.chunk(self.kind, self.id, name, piece, None, first=first))
                first = False
            yield _sse(protocol.chunk(self.kind, self.id, name, "", self.finish))
            if self.params.include_usage:
                yield _sse(protocol.chunk(self.kind, self.id, name, None, None, use=self.usage()))
        except APIError as e:
            yield _sse(e.body())
        finally:
            await pieces.aclose()               # a closed stream (client gone) cancels the engine request
        yield "data: [DONE]\n\n"


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _disconnected(request: HTTPRequest) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
