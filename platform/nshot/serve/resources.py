"""How much CPU and GPU each Serve replica asks Ray for, fitted to the cluster it runs on.

Every replica of an application is one Ray actor that holds ``replica_cpus`` CPUs and
``replica_gpus`` GPUs of the cluster's logical resources (what Ray's scheduler counts, not a cap
on the threads it runs) for as long as it lives. Serve's controller, its HTTP proxies and the
tasks that build a config's applications ask 0 CPU (Ray 2.60), so the replicas are all that
count against the cluster's CPUs: a replica that does not fit waits, unscheduled, forever.

The rule (:func:`fit`), for the replicas a deployment asks for (applications x ``num_replicas``,
or x the most replicas ``autoscale`` allows):

* By default (``replica_cpus=None``) each replica asks 1 CPU while they all fit the cluster's
  CPUs, else ``min(1, 0.9 * CPUs / replicas)`` (rounded down to Ray's 0.0001 step): all fit, and
  a tenth of the CPUs stays free for whatever else the cluster runs. A line says so.
* An explicit ``replica_cpus`` or ``replica_gpus`` whose replicas would not fit is refused before
  anything is deployed, with the numbers and the most that fits; a GPU request on a cluster
  without a GPU likewise. A cluster that reports no CPU at all (an autoscaling one whose workers
  have not joined yet) is not fitted: the requests go to Ray as they are.

The cluster is the running Ray (``ray.cluster_resources()``) when this process is connected to
one, else this machine as a Ray started here would see it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

from nshot.errors import NshotError

DEFAULT_CPUS = 1.0  # a replica's request while every replica fits
SHARE = 0.9  # of the cluster's CPUs that fitted replicas may take together
STEP = 1e-4  # Ray counts resources in steps of 0.0001


@dataclasses.dataclass(frozen=True)
class Capacity:
    """What the replicas are fitted to: ``cpus`` and ``gpus`` of ``where`` (for messages)."""

    cpus: float
    gpus: float
    where: str


def check_request(cpus: Any, gpus: Any) -> None:
    """A replica's request as Ray takes it: CPUs (None: fitted) a finite number > 0, GPUs a
    finite number >= 0 and, above 1, whole; both in Ray's 0.0001 steps. A one-line
    ``NshotError`` otherwise."""
    if cpus is not None:
        shown = _shown(cpus)
        if not _number(cpus) or not cpus > 0:
            raise NshotError(
                f"--replica-cpus {shown}: a replica asks a number of CPUs above 0 (e.g. 0.5, 1, 2)"
            )
        if cpus < STEP:
            raise NshotError(f"--replica-cpus {shown}: Ray counts CPUs in steps of {STEP:g}")
    shown = _shown(gpus)
    if not _number(gpus) or not gpus >= 0:
        raise NshotError(
            f"--replica-gpus {shown}: a replica asks 0 GPUs (the default) or more (e.g. 0.5, 1)"
        )
    if 0 < gpus < STEP:
        raise NshotError(f"--replica-gpus {shown}: Ray counts GPUs in steps of {STEP:g}")
    if gpus > 1 and gpus != int(gpus):
        raise NshotError(
            f"--replica-gpus {shown}: above 1, GPUs are whole (a replica shares one GPU or holds "
            "whole ones)"
        )


def _shown(x: Any) -> str:
    return f"{x:g}" if isinstance(x, int | float) and not isinstance(x, bool) else repr(x)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def parse_autoscale(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` replicas, 1 <= MIN <= MAX (a ``ValueError`` saying what is wrong)."""
    lo, sep, hi = str(text).partition(":")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        a = b = 0
    if not sep or not 1 <= a <= b:
        raise ValueError(f"autoscale {text!r}: give MIN:MAX replicas with 1 <= MIN <= MAX")
    return a, b


def replicas_of(opts: Any) -> int:
    """Replicas one application may run: ``num_replicas``, or the MAX of ``autoscale``."""
    if opts.autoscale:
        try:
            return parse_autoscale(opts.autoscale)[1]
        except ValueError as err:
            raise NshotError(f"--{err}") from None
    return int(opts.num_replicas)


def local_capacity() -> Capacity:
    """This machine as a Ray started here without ``num_cpus`` counts it (its CPU detection
    heeds a container's CPU quota; its GPUs are NVIDIA's, through NVML)."""
    try:
        from ray._private.utils import get_num_cpus

        cpus = float(get_num_cpus())
    except Exception:  # noqa: BLE001 - a private helper of Ray's; the plain count otherwise
        cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0)
        cpus = cpus or float(os.cpu_count() or 1)
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager = get_accelerator_manager_for_resource("GPU")
        visible = manager.get_current_process_visible_accelerator_ids()
        gpus = float(len(visible) if visible is not None else 0)
        if visible is None:
            gpus = float(manager.get_current_node_num_accelerators())
    except Exception:  # noqa: BLE001
        gpus = 0.0
    return Capacity(cpus, gpus, "this machine")


def capacity() -> Capacity | None:
    """The running Ray's resources when this process is connected to one; this machine when
    nshot would start its own Ray here; None when only a connection can tell (``RAY_ADDRESS``
    is set)."""
    import ray

    if ray.is_initialized():
        res = ray.cluster_resources()
        return Capacity(float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0)), "the Ray cluster")
    if os.environ.get("RAY_ADDRESS"):
        return None
    return local_capacity()


def _floor(x: float) -> float:
    """``x`` rounded down to Ray's step (and never below one step)."""
    return max(STEP, math.floor(x / STEP + 1e-9) * STEP)


def _units(x: float) -> int:
    return round(x / STEP)


def _g(x: float) -> str:
    return f"{x:.4f}".rstrip("0").rstrip(".")


def _replicas_text(applications: int, opts: Any) -> str:
    per = replicas_of(opts)
    total = applications * per
    if opts.autoscale:
        return (
            f"up to {total} replica{'s' * (total != 1)} ({applications} application"
            f"{'s' * (applications != 1)} x at most {per}, --autoscale {opts.autoscale})"
        )
    if applications == 1:
        return f"{total} replica{'s' * (total != 1)}"
    return f"{total} replicas ({applications} applications x {per})"


def fit(opts: Any, applications: int, cap: Capacity) -> tuple[Any, str | None]:
    """``opts`` with the request of every replica set (``replica_cpus`` no longer None), and the
    line to print when the default was scaled down (else None); an ``NshotError`` with the
    numbers when an explicit request cannot fit ``cap``. See the module's docstring."""
    check_request(opts.replica_cpus, opts.replica_gpus)
    n = applications * replicas_of(opts)
    who = _replicas_text(applications, opts)
    gpus = float(opts.replica_gpus)
    if gpus > 0:
        if cap.gpus <= 0:
            raise NshotError(
                f"--replica-gpus {_g(gpus)}: {who} x {_g(gpus)} GPU = {_g(n * gpus)} GPUs, but "
                f"{cap.where} has no GPU; leave --replica-gpus out to serve on CPUs"
            )
        if n * _units(gpus) > _units(cap.gpus):
            most = _floor(cap.gpus / max(n, 1))
            most = float(int(most)) if most > 1 else most  # above 1, whole GPUs
            raise NshotError(
                f"--replica-gpus {_g(gpus)}: {who} x {_g(gpus)} GPU = {_g(n * gpus)} GPUs, more "
                f"than the {_g(cap.gpus)} GPUs of {cap.where}; pass --replica-gpus {_g(most)} or "
                "less, or fewer replicas"
            )
    cpus = opts.replica_cpus
    if cap.cpus <= 0:  # nothing to fit to (yet): Ray holds the replicas until a node joins
        return dataclasses.replace(opts, replica_cpus=cpus or DEFAULT_CPUS), None
    share = _floor(min(DEFAULT_CPUS, SHARE * cap.cpus / max(n, 1)))
    if cpus is not None:
        cpus = float(cpus)
        if n * _units(cpus) > _units(cap.cpus):
            most = _floor(cap.cpus / max(n, 1))
            raise NshotError(
                f"--replica-cpus {_g(cpus)}: {who} x {_g(cpus)} CPU = {_g(n * cpus)} CPUs, more "
                f"than the {_g(cap.cpus)} CPUs of {cap.where}; pass --replica-cpus {_g(most)} or "
                f"less (leaving it out asks {_g(share)}), or fewer replicas"
            )
        return dataclasses.replace(opts, replica_cpus=cpus), None
    if n * DEFAULT_CPUS <= cap.cpus:
        return dataclasses.replace(opts, replica_cpus=DEFAULT_CPUS), None
    note = (
        f"{who} at {_g(DEFAULT_CPUS)} CPU each would need {_g(n * DEFAULT_CPUS)} CPUs, more than "
        f"the {_g(cap.cpus)} CPUs of {cap.where}: each replica asks {_g(share)} CPU instead "
        f"({SHARE:g} x {_g(cap.cpus)} / {n}; --replica-cpus sets it)"
    )
    return dataclasses.replace(opts, replica_cpus=share), note


def fitted(
    opts: Any,
    applications: int,
    *,
    start_ray: bool,
    notify: Callable[[str], None] | None = None,
) -> Any:
    """:func:`fit` ``opts`` for ``applications`` to the cluster they will run on, printing the
    line through ``notify`` (default: the ``nshot.serve`` logger's warning).

    With ``start_ray`` (serving now) Ray is started, or connected to, here; an explicit request
    that cannot fit this machine is refused before a Ray of nshot's own starts. Without it
    (writing a config) Ray is only connected to when ``RAY_ADDRESS`` names a cluster; otherwise
    this machine (or the Ray this process already runs) is the measure."""
    from nshot.train import ensure_ray

    cap = capacity()
    if cap is None or start_ray:
        if cap is not None:
            fit(opts, applications, cap)  # refuses before Ray starts
        ensure_ray()
        cap = capacity()
        assert cap is not None
    opts, note = fit(opts, applications, cap)
    if note:
        if notify is None:
            import logging

            logging.getLogger("nshot.serve").warning(note)
        else:
            notify(note)
    return opts
