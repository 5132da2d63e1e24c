"""The benchmark's progress: on a terminal, one tqdm bar per benchmark with each method's running tau
and tok/s; otherwise e2e.print_progress's one line per prompt (a log of the run, on stderr)."""
from __future__ import annotations

import sys

from specpilot.progress import on_terminal

from .e2e import print_progress, running_summary


class LiveProgress:
    """run_benchmark's `progress` callback; close() when the run ends."""

    def __init__(self):
        self.bar, self.name = None, None

    def __call__(self, name, k, n, turn, rows):
        if not on_terminal():
            print_progress(name, k, n, turn, rows)
            return
        from tqdm import tqdm

        if name != self.name:
            self.close()
            self.bar, self.name = tqdm(total=n, desc=name, unit="prompt", file=sys.stderr, dynamic_ncols=True), name
        self.bar.set_postfix_str(running_summary(name, rows), refresh=False)
        self.bar.update(k - self.bar.n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        self.bar, self.name = None, None
