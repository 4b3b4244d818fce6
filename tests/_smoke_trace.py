"""The metrics a ``smoke`` run reports, step by step: the trace the training-loop tests compare
against ``tests/smoke_trace.json`` (recorded from the loops as they were written per method,
before the platform's trainer took them over).

``capture()`` records every report a run makes in this process (Ray Train's local mode runs the
loop in-process); timings and throughput are left out, since they are not a function of the
seed. ``NSHOT_RECORD_SMOKE_TRACE=1`` makes the conformance test write the file instead of
comparing with it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

TRACE_FILE = Path(__file__).with_name("smoke_trace.json")

#: keys that measure time or throughput, not the run's numbers
VOLATILE = ("samples_per_s",)
VOLATILE_SUFFIXES = ("wall_s", "step_s", "epoch_s", "_seconds")


def recording() -> bool:
    return os.environ.get("NSHOT_RECORD_SMOKE_TRACE", "") == "1"


def _steady(metrics: dict) -> dict:
    return {
        k: v for k, v in metrics.items() if k not in VOLATILE and not k.endswith(VOLATILE_SUFFIXES)
    }


@contextlib.contextmanager
def capture():
    """Yield a list that receives ``{metric: value}`` for every report made inside the block
    (timings and throughput left out)."""
    from nshot.train.session import recorded_reports

    seen: list[dict] = []
    with recorded_reports() as reports:
        try:
            yield seen
        finally:
            seen.extend(_steady(r) for r in reports)


#: the methods whose smoke numbers depend on a model the test session trains first (the tiny
#: LM, trained on as many torch threads as the process has, whose weights depend on that
#: count): their trace is compared in its structure (report steps and metric names) only
STRUCTURE_ONLY = frozenset({"keystone", "zerounlearn"})


def platform() -> dict:
    """What float results depend on beyond the code: torch's version and the CPU kernels it
    picked. The numbers of a trace are compared only on the platform that recorded them."""
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def recorded() -> dict:
    return json.loads(TRACE_FILE.read_text()) if TRACE_FILE.exists() else {}


def record(name: str, trace: list[dict]) -> None:
    data = recorded()
    data[name] = trace
    data["_platform"] = platform()
    TRACE_FILE.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
