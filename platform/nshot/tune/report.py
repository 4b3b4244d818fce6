"""What every trial reports to Tune: the objective ``f`` and the auxiliary vector ``h``.

A method's train loop reports its own metrics (``loss``, ``val_acc``, ...). During a sweep the
platform adds two keys to every report that carries the objective metric:

* ``f``: the objective's latest value (so ``f`` of the last report is the trial's objective,
  and ASHA can stop on intermediate ``f``);
* ``h``: the learning curve so far, a list of rows ``[m_1, ..., m_k]`` (one per report, one
  column per name in ``TuneSpec.curve``), i.e. the per-epoch validation curve by default.

In-process trials (``workers=0``) add them in :func:`nshot.train.session.report`; trials that run
a Ray Train worker group add them in :class:`NshotTuneCallback`, a Train V2 callback.
"""

from __future__ import annotations

import math
from typing import Any

from ray.tune.integration.ray_train import TuneReportCallback


class CurveTracker:
    """Accumulates ``h`` from successive reports and gives ``{"f": ..., "h": ...}``."""

    def __init__(self, metric: str, mode: str = "max", curve: list[str] | tuple[str, ...] = ()):
        self.metric = metric
        self.mode = mode
        self.curve = tuple(curve) or (metric,)
        self.rows: list[list[float]] = []
        self.f: float | None = None

    def update(self, metrics: dict[str, Any]) -> dict[str, Any]:
        if self.metric not in metrics:
            return {} if self.f is None else {"f": self.f, "h": [list(r) for r in self.rows]}
        self.f = float(metrics[self.metric])
        row = []
        for name in self.curve:
            v = metrics.get(name)
            if v is None and self.rows:
                v = self.rows[-1][len(row)]  # carry the last value of a metric not reported now
            v = float("nan") if v is None else float(v)
            row.append(v if math.isfinite(v) else float("nan"))
        self.rows.append(row)
        return {"f": self.f, "h": [list(r) for r in self.rows]}


class NshotTuneCallback(TuneReportCallback):
    """Ray Train V2 callback: forwards rank 0's reports to the Tune trial, adding ``f``/``h``."""

    def __init__(self, metric: str, mode: str = "max", curve: tuple[str, ...] = ()):
        super().__init__()
        self._tracker = CurveTracker(metric, mode, curve)

    def after_report(self, run_context, metrics, checkpoint):  # noqa: ANN001 - Ray's signature
        first = dict(metrics[0]) if metrics else {}
        first.update(self._tracker.update(first))
        super().after_report(run_context, [first, *metrics[1:]], checkpoint)
