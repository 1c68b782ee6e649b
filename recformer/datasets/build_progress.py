"""What ``recformer data build`` says while it works: a line per stage on stderr, with the seconds
since the build started and the rows it works on (a build of a million events is about a minute,
most of it inside single stages), and, on a terminal, a bar over the user buckets of the stages
that loop over them. ``progress=False`` silences both; the summary at the end is printed anyway."""

from __future__ import annotations

import sys
import time
from typing import Any

QUIET_S = 10.0
"""Seconds between two bucket lines when stderr is not a terminal (a log file)."""


class BuildProgress:
    """Stage lines (``stage``) and the bucket bar (``update``, ``set_postfix_str``: what the stages
    call), in one place."""

    def __init__(self, progress: bool | None, stages: int) -> None:
        """``progress``: True always, False never, None: stage lines always and the bar only when
        stderr is a terminal. ``stages``: how many ``stage`` calls the build makes."""
        self.lines = progress is not False
        self.bar_on = progress is True or (progress is None and sys.stderr.isatty())
        self.stages, self.done = stages, 0
        self.t0 = self.said_at = time.perf_counter()
        self.bar: Any = None
        self.name, self.buckets, self.step = "", 0, 0

    def start_bar(self, steps: int, buckets: int) -> None:
        """The bar over ``steps`` bucket steps, once their number is known (after the check)."""
        self.buckets = buckets
        if self.bar_on:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=steps, desc="data build", unit="bucket", file=sys.stderr)

    def stage(self, what: str) -> None:
        """``data build:   12.3 s  2/6 partition 1,000,000 events into 1 user bucket(s)``."""
        self.done, self.step, self.name = self.done + 1, 0, what.split(":")[0]
        if not self.lines:
            return
        self._say(f"{self.done}/{self.stages} {what}")
        if self.bar is not None:
            self.bar.set_postfix_str(self.name)

    def update(self, n: int = 1) -> None:
        """A bucket of the current stage begins: the bar moves; with no bar (not a terminal) and
        several buckets, a line says which, at most every ``QUIET_S`` seconds."""
        self.step += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.lines and self.buckets > 1 and time.perf_counter() - self.said_at >= QUIET_S:
            self._say(f"    {self.name}: bucket {self.step} of {self.buckets}")

    def _say(self, what: str) -> None:
        self.said_at = time.perf_counter()
        line = f"data build: {self.said_at - self.t0:7.1f} s  {what}"
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)  # above the bar, which redraws below
        else:
            print(line, file=sys.stderr, flush=True)

    def set_postfix_str(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
