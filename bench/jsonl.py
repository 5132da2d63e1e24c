"""Benchmark rows as JSONL: one JSON object per line, each carrying what it needs to stand alone
(the benchmark's name, the date, the card), so that files of several runs concatenate and a run that
stops half way keeps the rows it measured."""
from __future__ import annotations

import datetime
import json
from contextlib import contextmanager


@contextmanager
def row_writer(path, bench: str, **common):
    """Yields write(row): each row goes to `path` at once, prefixed with bench, date and `common`."""
    stamp = {"bench": bench, "date": datetime.date.today().isoformat(), **common}
    with open(path, "w", encoding="utf-8") as f:
        def write(row: dict) -> None:
            f.write(json.dumps({**stamp, **row}) + "\n")
            f.flush()
        yield write


def write_rows(path, bench: str, rows: list[dict], **common) -> None:
    """All of `rows` to `path` (see row_writer)."""
    with row_writer(path, bench, **common) as write:
        for row in rows:
            write(row)
