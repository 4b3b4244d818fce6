"""One line per finished trial of an ``nshot tune`` sweep, instead of Tune's status tables.

``[nshot tune] trial 3/10 done  f=0.8125  best f=0.8400 (trial 1) | 1m12s, ETA 2m48s``

The line goes to stderr when a trial completes or fails; the ETA extrapolates the sweep's pace
so far over the trials left. Tune's own tables come back with ``nshot tune --verbose``.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from ray.tune import Callback

from nshot.train.session import format_duration


class SweepProgress(Callback):
    """A Tune callback printing one progress line per finished trial (picklable: Tune stores
    the run config, callbacks included, with the sweep so that it can be resumed)."""

    def __init__(self, num_samples: int, mode: str, stream: Any = None):
        self.num_samples = int(num_samples)
        self.mode = mode
        self.stream = stream
        self._start: float | None = None
        self._finished = 0
        self._best: tuple[float, str] | None = None

    def setup(self, **info: Any) -> None:
        self._start = time.time()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finished += 1
        self._print(self.line(trial.trial_id, trial.last_result.get("f"), failed=False))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finished += 1
        self._print(self.line(trial.trial_id, None, failed=True))

    def line(self, trial_id: str, f: Any, *, failed: bool, now: float | None = None) -> str:
        """The progress line after a trial finished (``self._finished`` counts it already)."""
        now = time.time() if now is None else now
        start = self._start if self._start is not None else now
        value = float(f) if isinstance(f, int | float) and math.isfinite(float(f)) else None
        if value is not None and (
            self._best is None
            or (value > self._best[0] if self.mode == "max" else value < self._best[0])
        ):
            self._best = (value, trial_id)
        shown = "failed" if failed else "done"
        if value is not None:
            shown += f"  f={value:.4g}"
        if self._best is not None:
            shown += f"  best f={self._best[0]:.4g} (trial {self._best[1]})"
        k, n = self._finished, self.num_samples
        eta = ""
        if 0 < k < n and now > start:
            eta = f", ETA {format_duration((now - start) / k * (n - k))}"
        return (
            f"[nshot tune] trial {k}/{n} {trial_id} {shown} | {format_duration(now - start)}{eta}"
        )

    def _print(self, text: str) -> None:
        print(text, file=self.stream or sys.stderr, flush=True)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["stream"] = None  # a terminal stream does not pickle
        return state
