"""Progress reporting for long work: one tqdm bar per stage on a terminal."""
from __future__ import annotations

import sys
from typing import Callable, TextIO

from tqdm.auto import tqdm

ProgressFn = Callable[[str, int, int], None]
# The stages of a training cycle (rlhf.cycle), in the order they run.
STAGES = ("data", "reward", "policy", "judge", "evaluate")


class StageBars:
    """Callable ``(stage, done, total)`` that draws one bar per stage, closing the previous one."""

    def __init__(self, file: TextIO | None = None, disable: bool = False) -> None:
        self.file = file or sys.stderr
        self.disable = disable
        self._stage: str | None = None
        self._bar: tqdm | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self._stage:
            self.close()
            self._stage = stage
            self._bar = tqdm(total=total, desc=f"{stage:>10}", file=self.file, disable=self.disable,
                             leave=True, dynamic_ncols=True, unit="step" if total > 1 else "it")
        assert self._bar is not None
        if total != self._bar.total:
            self._bar.total = total
        self._bar.update(max(0, done - self._bar.n))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar = None
        self._stage = None

    def __enter__(self) -> "StageBars":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
