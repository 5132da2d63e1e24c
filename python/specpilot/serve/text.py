"""Token ids -> the text a client sees, step by step, with OpenAI's `stop` strings.

The text is always the decode of every token so far (skip_special_tokens, as `specpilot generate`
prints it), so what was streamed concatenates to exactly the non-streamed text. Text is held back
while it might still change or be cut: a trailing U+FFFD (an incomplete UTF-8 sequence the next
token may finish) and a tail that is a prefix of some stop string. The first stop string completed
ends the text before it (the stop string itself is not returned, as OpenAI does).
"""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: tuple = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.tokens: list = []
        self.emitted = 0              # characters handed out so far
        self.stopped = False          # a stop string matched: generation should end
        self._text = ""

    def add(self, new_tokens: list) -> str:
        """Appends tokens; returns the newly safe text ("" once a stop string has matched)."""
        if self.stopped:
            return ""
        self.tokens.extend(new_tokens)
        self._text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cut = self._first_stop(self._text)
        if cut is not None:
            self.stopped = True
            self._text = self._text[:cut]
            return self._take(len(self._text))
        return self._take(len(self._text) - self._holdback(self._text))

    def flush(self) -> str:
        """The rest of the text once generation has ended."""
        return self._take(len(self._text))

    @property
    def text(self) -> str:
        return self._text

    def _take(self, end: int) -> str:
        if end <= self.emitted:
            return ""
        out, self.emitted = self._text[self.emitted:end], end
        return out

    def _first_stop(self, text: str):
        """Where the text ends: the start of the stop string that is completed first reading the text
        character by character (the earliest end; the longest at a tie), so the cut does not depend on
        how many tokens each step committed."""
        start = max(0, self.emitted - max((len(s) for s in self.stop), default=0))
        hits = [(i + len(s), i) for s, i in ((s, text.find(s, start)) for s in self.stop) if i >= 0]
        return min(hits)[1] if hits else None

    def _holdback(self, text: str) -> int:
        """Characters at the end that may still change or start a stop string: the incomplete tail, and
        before it the longest proper prefix of a stop string (the tail may complete that stop string)."""
        complete = text.rstrip("\ufffd")
        prefix = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(complete)), prefix, -1):
                if complete.endswith(s[:k]):
                    prefix = k
                    break
        return len(text) - len(complete) + prefix
