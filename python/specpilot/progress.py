"""Progress bars for long work (loading weights, stock runs, benchmarks): tqdm on stderr when stderr is a
terminal, nothing at all otherwise (piped and logged output stays plain text, no control codes)."""
from __future__ import annotations

import sys


def on_terminal(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


def progress(iterable=None, total=None, desc=None, unit="it"):
    """`iterable` with a tqdm bar on a terminal; the same items, silently, when stderr is not one.
    The bar disappears when done (leave=False), so what a command prints stays as it was."""
    if not on_terminal():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=True)


def bold(text: str, stream=None) -> str:
    """`text` in bold on a terminal (stdout by default), as it is when piped."""
    return f"\033[1m{text}\033[0m" if on_terminal(sys.stdout if stream is None else stream) else text
