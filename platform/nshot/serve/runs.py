"""Every trained run of a storage folder behind one Serve instance (``nshot serve --all``).

:func:`find_runs` looks at each run folder directly under a storage folder (``<storage>/<run
name>``, as ``nshot train`` writes them), takes its newest complete checkpoint and verifies it;
one application per method is served, from the run whose newest checkpoint is the most recent.
Every other run is reported with the reason it is left out. :func:`serve_config` writes the same
deployment as a Ray Serve config (one application per method, each with its own route and
arguments) for a user who wants a different token or options per application, or
``serve deploy`` on a cluster.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nshot.errors import NshotError


@dataclass
class Runs:
    """What :func:`find_runs` found: ``chosen`` maps a method to the checkpoint it serves (and
    ``runs`` to its run folder); ``skipped`` lists ``(run folder, reason)`` for the others."""

    chosen: dict[str, Path] = field(default_factory=dict)
    runs: dict[str, Path] = field(default_factory=dict)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def find_runs(storage: str | os.PathLike) -> Runs:
    """The newest verified checkpoint of each method among the run folders of ``storage``.

    A folder is left out (and listed in ``skipped``) when it is a symbolic link (not followed:
    nshot reads nothing outside ``<storage>/<run name>``), holds no complete checkpoint, holds
    one that fails verification, or belongs to a method that a more recent run also has. An
    :class:`NshotError` when ``storage`` is not a folder or no run can be served."""
    from nshot.method import get
    from nshot.train.checkpoint import load_checkpoint

    root = Path(storage).expanduser()
    if not root.is_dir():
        raise NshotError(f"--all {storage}: not a folder of runs")
    found: dict[str, tuple[float, Path, Path]] = {}
    runs = Runs()
    for run in sorted(p for p in root.iterdir() if not p.name.startswith(".")):
        if run.is_symlink():
            runs.skipped.append((run, "a symbolic link (not followed)"))
            continue
        if not run.is_dir():
            continue
        try:
            ckpt = load_checkpoint(run)
            get(ckpt.method)  # a method this installation does not have cannot be served
        except NshotError as err:
            runs.skipped.append((run, str(err)))
            continue
        when = (ckpt.path / "state.json").stat().st_mtime
        older = found.get(ckpt.method)
        if older is None or when > older[0]:
            if older is not None:
                runs.skipped.append((older[1], f"an older run of {ckpt.method} (newest: {run})"))
            found[ckpt.method] = (when, run, ckpt.path)
        else:
            runs.skipped.append((run, f"an older run of {ckpt.method} (newest: {older[1]})"))
    if not found:
        why = "; ".join(f"{p.name}: {r}" for p, r in runs.skipped[:3]) or "it holds no run folder"
        raise NshotError(f"--all {storage}: no run with a servable checkpoint ({why})")
    for method in sorted(found):
        runs.runs[method], runs.chosen[method] = found[method][1], found[method][2]
    runs.skipped.sort()
    return runs


def serve_config(
    chosen: dict[str, Path], options: Any, *, host: str = "127.0.0.1", port: int = 8000
) -> dict[str, Any]:
    """A Ray Serve config (``serve run`` / ``serve deploy``) that serves ``chosen``: one
    application per method at ``/<method>``, each built by ``nshot.serve.app:app_builder`` with
    the given :class:`~nshot.serve.app.ServeOptions` as its arguments. The token is never
    written: each application reads ``$NSHOT_SERVE_TOKEN`` unless its ``token`` argument is set
    (edit the file for a token or options per application).

    Every application's arguments carry what each replica asks Ray for, ``replica_cpus`` and
    ``replica_gpus``: ``options.replica_cpus`` when set, else fitted so that every
    application's replicas fit this machine, or the Ray this process is connected to
    (:func:`nshot.serve.resources.fit`; ``nshot serve --all --write-config`` fits them and says
    so before calling this)."""
    if options.replica_cpus is None:
        from nshot.serve.resources import capacity, fit, local_capacity

        options, _ = fit(options, len(chosen), capacity() or local_capacity())
    defaults = asdict(type(options)())
    always = ("replica_cpus", "replica_gpus")  # written even at their defaults
    args = {
        k: v
        for k, v in asdict(options).items()
        if k != "token" and (k in always or v != defaults[k])
    }
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": host, "port": port},
        "applications": [
            {
                "name": method,
                "route_prefix": f"/{method}",
                "import_path": "nshot.serve.app:app_builder",
                "args": {"method": method, "checkpoint": str(path), **args},
            }
            for method, path in sorted(chosen.items())
        ],
    }
