"""Progress bars for long commands (tune, bench, carry, export): counts and time left on
stderr, drawn by rich where stderr is a terminal and ``quiet`` is off; elsewhere nothing,
and the commands' log lines go on as they are (for files and CI logs)."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any


class Progress:
    """``with Progress(total, "tuning") as bar: ... bar.advance()``."""

    def __init__(self, total: int, description: str, quiet: bool = False):
        self.total = total
        self.description = description
        self.enabled = not quiet and total > 0 and sys.stderr.isatty()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, steps)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
