"""The engine thread: a BatchEngine stepping in its own thread, fed by a thread-safe inbox.

The asyncio side submits a Request with a Ticket and awaits the ticket's events; the engine thread
posts each step's new tokens ("tokens") and the final BatchResult ("done") back onto the event loop
with call_soon_threadsafe. Only the engine thread touches the engine.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time

log = logging.getLogger("specpilot.serve")


class EngineStopped(RuntimeError):
    """The engine thread no longer takes requests (shutting down, or it failed)."""


class Ticket:
    """One request's channel from the engine thread to its asyncio handler."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.request_id: int | None = None       # the engine's id, set by the engine thread
        self.sent = 0                            # tokens already posted

    def post(self, kind: str, payload) -> None:
        """From the engine thread: queue an event for the handler (a closed loop drops it)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:
            pass


class EngineWorker:
    def __init__(self, engine, metrics=None, idle_wait_s: float = 0.05):
        self.engine = engine
        self.metrics = metrics
        self.idle_wait_s = idle_wait_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._tickets: dict = {}                 # engine request id -> Ticket (engine thread only)
        self._accepting = True
        self._stop = threading.Event()
        self.failure: str | None = None          # why the engine thread died, if it did
        self.outcomes = {"finished": 0, "cancelled": 0, "failed": 0}   # results handed out, by outcome
        self._shutdown = None                    # (deadline, outcomes then) once shutdown began
        self._submitted = self._taken = 0        # submits put in the inbox / taken out of it
        self._thread = threading.Thread(target=self._run, name="specpilot-engine", daemon=True)

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    @property
    def in_flight(self) -> int:
        return len(self._tickets) + self._submitted - self._taken

    # -- called from the asyncio side ----------------------------------------------------------
    def submit(self, request, ticket: Ticket) -> None:
        if not self._accepting or not self.alive:
            raise EngineStopped(self.failure or "the server is shutting down")
        self._submitted += 1                     # written by the asyncio thread only
        self._inbox.put(("submit", request, ticket))

    def cancel(self, ticket: Ticket) -> None:
        """Frees the ticket's request (queued or running); harmless once it has finished."""
        self._inbox.put(("cancel", None, ticket))

    def begin_shutdown(self, grace_s: float) -> None:
        """Stops taking requests and says how many are in flight (the HTTP server then drains them)."""
        if self._shutdown is not None:
            return
        self._accepting = False
        self._shutdown = (time.monotonic() + grace_s, dict(self.outcomes))
        log.info("shutdown: %d request(s) in flight; finishing them for up to %.1f s, then cancelling the rest",
                 self.in_flight, grace_s)

    def shutdown(self, grace_s: float) -> dict:
        """begin_shutdown, then waits for the in-flight requests until its deadline, cancels the rest,
        stops the thread and says what became of the requests in flight at begin_shutdown. Returns
        {"finished": n, "cancelled": m, "failed": k}."""
        self.begin_shutdown(grace_s)
        deadline, before = self._shutdown
        while self.in_flight and self.alive and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.in_flight:
            self._inbox.put(("cancel_all", None, None))
            until = time.monotonic() + 10
            while self.in_flight and self.alive and time.monotonic() < until:
                time.sleep(0.02)
        self._stop.set()
        self._thread.join(timeout=10)
        done = {key: self.outcomes[key] - before[key] for key in self.outcomes}
        log.info("shutdown: %d request(s) finished, %d cancelled, %d failed; engine stopped",
                 done["finished"], done["cancelled"], done["failed"])
        return done

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain(block=self.engine.idle)
                if self.engine.idle:
                    continue
                t0 = time.perf_counter()
                finished = self.engine.step()
                if self.metrics is not None:
                    ran = len(self.engine.running) + sum(r.error is None for r in finished)
                    self.metrics.observe_step(time.perf_counter() - t0, ran, len(self.engine.queue))
                self._post_progress()
                for result in finished:
                    self._finish(result)
        except Exception as e:                   # the engine's state is unknown now: fail what is in flight
            self.failure = f"the engine failed: {type(e).__name__}: {e}"
            log.exception("engine thread failed; every in-flight request fails")
            for ticket in list(self._tickets.values()):
                ticket.post("failed", self.failure)
            self._tickets.clear()
            while True:
                try:
                    _, _, ticket = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if ticket is not None:
                    ticket.post("failed", self.failure)

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.idle_wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, request, ticket: Ticket | None) -> None:
        if kind == "submit":
            self._taken += 1                     # written by the engine thread only
            ticket.request_id = self.engine.submit(request)
            self._tickets[ticket.request_id] = ticket
        elif kind == "cancel":
            if ticket.request_id is not None and ticket.request_id in self._tickets:
                self.engine.cancel(ticket.request_id)
        elif kind == "cancel_all":
            for rid in list(self._tickets):
                self.engine.cancel(rid)
        # A ticket cancelled before its submit was handled: the submit came first in the inbox.

    def _post_progress(self) -> None:
        for rid, tokens in self.engine.progress().items():
            ticket = self._tickets.get(rid)
            if ticket is not None and len(tokens) > ticket.sent:
                ticket.post("tokens", list(tokens[ticket.sent:]))
                ticket.sent = len(tokens)

    def _finish(self, result) -> None:
        ticket = self._tickets.pop(result.request_id, None)
        outcome = "finished" if result.error is None else "cancelled" if result.error == "cancelled" else "failed"
        self.outcomes[outcome] += 1
        if self.metrics is not None:
            self.metrics.observe_result(result)
        if ticket is None:
            return
        if len(result.tokens) > ticket.sent:
            ticket.post("tokens", list(result.tokens[ticket.sent:]))
            ticket.sent = len(result.tokens)
        ticket.post("done", result)
