"""TextStream: the `on_tokens` callback of Engine.generate_ar / generate_spec that turns token ids into
text as they come (for `specpilot generate`), and keeps them for a Ctrl-C summary."""
from __future__ import annotations

import time


class TextStream:
    """Collects new token ids; with `out`, writes their text as soon as it is complete. A token can
    end inside a multi-byte character (byte-level BPE), so text ending in U+FFFD waits for the next
    token; the pending tokens restart after each newline to keep decoding cheap. What is written
    equals tokenizer.decode(all tokens, skip_special_tokens=True)."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out = tokenizer, out
        self.tokens: list[int] = []
        self.start = time.perf_counter()
        self._pending: list[int] = []      # tokens whose text is not (all) written yet
        self._written = 0                  # characters of decode(_pending) already written

    def __call__(self, new_tokens) -> None:
        self.tokens.extend(int(t) for t in new_tokens)
        if self.out is None:
            return
        self._pending.extend(int(t) for t in new_tokens)
        text = self._decode(self._pending)
        if text.endswith("\ufffd"):       # an incomplete character: wait for its last bytes
            return
        self._write(text[self._written:])
        if text.endswith("\n"):
            self._pending, self._written = [], 0
        else:
            self._written = len(text)

    def finish(self) -> None:
        """Writes whatever is still pending (an incomplete character as U+FFFD, as decode does)."""
        if self.out is not None and self._pending:
            self._write(self._decode(self._pending)[self._written:])
            self._pending, self._written = [], 0

    @property
    def text(self) -> str:
        return self._decode(self.tokens)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
