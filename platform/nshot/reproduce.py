"""`nshot reproduce`: run a method's ``experiments()`` and write results.json, results.md and a PNG.

results.json has the same schema for every method::

    {"method": str, "preset": str, "seeds": int,
     "metrics": {name: {"higher_is_better": bool}},
     "rows": {system: {metric: float | null, "<metric>_std": float | null}},
     "runtime_s": float, "notes": [str], "extra": {...},
     "samples": {system: {metric: [float | null, ...]}},      # when the method keeps them
     "claims": [{"id", "statement", "source", "expr", "holds": bool | null,
                 "lhs", "rhs", "p"}],
     "run": {"date", "started_at", "commit", "dirty", "dirty_files", "nshot_version",
             "versions": {"python": str, distribution: str | null},
             "config": {...}, "overrides": {...}, "seeds": {...}, "torch_threads", "cpu_count",
             "ray_cpus", "loadavg_start": [1 min, 5 min, 15 min], "wall_s"}}

``run`` is the run's provenance (:func:`run_info`): the full commit of the checkout it ran from
and whether tracked files had uncommitted changes, the resolved config and the overrides given
on the command line, the config's seeds, the torch threads and CPUs of the machine (and those
Ray saw, when it was up), the host's load average when it started and its wall time.
``nshot reproduce`` refuses to write into a ``methods/<name>/results/`` folder of the repository
from a dirty tree (:func:`nshot.provenance.refuse_dirty`), and writes there as
``<preset>.json``/``.md``/``.png`` (the committed names), its extra plots as ``<preset>-*.png``.
A committed result is *fresh* while the code its run executes has not changed since its commit
(:func:`nshot.provenance.freshness`); ``nshot claims --write`` re-evaluates claims and keeps the
run block, so it does not change freshness.

``run.versions`` holds the versions of the packages that produced the numbers: the platform's
own (:data:`BASE_PACKAGES`) and the method's ``packages`` (``null``: not installed). Before it
runs, ``nshot reproduce`` compares them with the committed results of the same method and
preset (``methods/<name>/results/<preset>.json``) and warns about every difference, so that a
rerun that reads differently says why it may.

``nshot reproduce --all`` (:func:`run_all`) runs every registered method's reproduction, one at
a time here, or as one Ray task per method when ``RAY_ADDRESS`` names a cluster; a method whose
results are fresh is skipped unless ``--force``.

``null`` marks a system that cannot be evaluated on a metric (for example a fixed-slot
model asked for more classes than it has slots).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nshot.errors import NshotError
from nshot.method import MethodConfig, ResultsTable, available, get
from nshot.provenance import method_results_dir

# the platform's packages whose versions can move any method's numbers
BASE_PACKAGES = ("nshot", "torch", "numpy", "scipy", "scikit-learn", "ray", "transformers")


def run(
    method_name: str,
    cfg: MethodConfig,
    out: str | Path,
    overrides: dict[str, Any] | None = None,
    *,
    git: dict[str, Any] | None = None,
    scale: str | None = None,
) -> dict[str, Any]:
    """Run ``method_name``'s comparison on ``cfg`` and write its results under ``out``.

    ``scale``: a scaling preset (``gpu8``, ...): every job that trains a network runs with its
    CPUs and GPUs per worker (:class:`nshot.experiment.JobScale`); ``None``: as each job
    declares.

    ``overrides``: the config fields the user set (recorded beside the resolved config);
    ``git``: the checkout's state to record (default: read here, see
    :func:`nshot.provenance.git_state`). Into the method's own ``results/`` folder the files
    get the committed names (:func:`results_stem`) and the comparison works in a temporary
    folder; a dirty tree may not write there (checked before any work)."""
    from nshot import provenance

    method = get(method_name)
    out = Path(out).expanduser().resolve()
    provenance.refuse_dirty(out)
    stem = results_stem(method_name, cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    for line in version_drift(method_name, cfg.preset, experiment_of(cfg)):
        print(f"[nshot reproduce] warning: {line}", file=sys.stderr, flush=True)
    from nshot.experiment import JobScale, scaled

    job_scale = JobScale.preset(scale) if scale else None
    info = run_info(method_name, cfg, overrides, git=git)
    if job_scale is not None:
        info["scale"] = {"name": scale, "cpus": job_scale.cpus, "gpus": job_scale.gpus}
    t0 = time.time()
    scratch = (
        tempfile.TemporaryDirectory(prefix=f"nshot-{method_name}-")
        if stem != "results"
        else contextlib.nullcontext(str(out))
    )
    with scratch as workdir, scaled(job_scale):
        table = method.experiments(cfg, Path(workdir))
        wall = time.time() - t0
        if not table.runtime_s:
            table.runtime_s = wall
        info.update(_after_run(wall))
        data = write(table, out, stem=stem, run=info)
        if stem != "results":
            for png in sorted(Path(workdir).glob("*.png")):
                name = png.name if png.stem.startswith(f"{stem}-") else f"{stem}-{png.name}"
                shutil.copyfile(png, out / name)
    return data


def results_stem(method_name: str, cfg: MethodConfig, out: Path) -> str:
    """``results`` (results.json, .md, .png), or, in the method's own committed ``results/``
    folder, the committed name: ``<preset>`` or ``<preset>-<experiment>``."""
    if Path(out).expanduser().resolve() == method_results_dir(method_name).resolve():
        return committed_results_name(cfg.preset, experiment_of(cfg))[: -len(".json")]
    return "results"


def write(
    table: ResultsTable, out: Path, stem: str = "results", run: dict[str, Any] | None = None
) -> dict[str, Any]:
    data = with_claims(table.to_json())
    data["run"] = run if run is not None else run_info(data["method"])
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out / f"{stem}.md").write_text(to_markdown(data))
    plot(data, out / f"{stem}.png")
    return data


def package_versions(method_name: str | None = None) -> dict[str, str | None]:
    """Python's version and those of :data:`BASE_PACKAGES` and the method's ``packages``
    (``None`` for a distribution that is not installed)."""
    import platform as _platform
    from importlib.metadata import PackageNotFoundError, version

    names = list(BASE_PACKAGES)
    if method_name is not None:
        names += [p for p in get(method_name).packages if p not in names]
    out: dict[str, str | None] = {"python": _platform.python_version()}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def experiment_of(cfg: MethodConfig) -> str | None:
    """The experiment ``cfg`` selects through its ``experiment`` field, if the method has more
    than one; ``None`` for the main comparison (the field's default) or a method without it."""
    field = type(cfg).model_fields.get("experiment")
    value = getattr(cfg, "experiment", None)
    return None if field is None or value == field.default else str(value)


def committed_results_name(preset: str, experiment: str | None = None) -> str:
    """``<preset>.json``, or ``<preset>-<experiment>.json`` for another experiment."""
    return f"{preset}-{experiment}.json" if experiment else f"{preset}.json"


def version_drift(method_name: str, preset: str, experiment: str | None = None) -> list[str]:
    """One line per package whose version here differs from the committed results of
    ``method_name`` at ``preset`` (and ``experiment``; none when nothing is committed or it
    records no versions)."""
    try:
        committed_file = method_results_dir(method_name) / committed_results_name(
            preset, experiment
        )
        committed = json.loads(committed_file.read_text())["run"]["versions"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    here = package_versions(method_name)
    lines = []
    for name in sorted(set(committed) | set(here)):
        if name not in committed or committed.get(name) == here.get(name):
            continue
        then, now = committed[name], here.get(name)
        lines.append(
            f"{name} {now or 'not installed'} here, {then or 'not installed'} in the committed "
            f"results ({committed_file}): the numbers may differ for that reason"
        )
    return lines


def run_info(
    method_name: str | None = None,
    cfg: MethodConfig | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    git: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """When, from what code and on what machine a reproduction runs: UTC date and time, nshot's
    version, the full git commit of the checkout and whether tracked files had uncommitted
    changes (``dirty``, with the first 20 such files; ``None`` outside a checkout), the versions
    of the packages that produce the numbers (:func:`package_versions`), the resolved config and
    the user's overrides, the config's seed fields, torch's threads, the CPU count and the
    host's load average. :func:`run` adds the wall time and the CPUs Ray saw."""
    import datetime

    import torch

    from nshot import __version__
    from nshot.provenance import git_state

    git = git if git is not None else git_state()
    now = datetime.datetime.now(datetime.UTC)
    info: dict[str, Any] = {
        "date": now.strftime("%Y-%m-%d"),
        "started_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "dirty_files": list(git.get("dirty_files") or [])[:20],
        "nshot_version": __version__,
        "versions": package_versions(method_name),
    }
    if cfg is not None:
        config = cfg.model_dump(mode="json")
        info["config"] = config
        info["overrides"] = dict(overrides or {})
        info["seeds"] = {k: v for k, v in config.items() if "seed" in k}
    info["torch_threads"] = torch.get_num_threads()
    info["cpu_count"] = os.cpu_count()
    try:
        info["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on this platform
        info["loadavg_start"] = None
    return info


def _after_run(wall_s: float) -> dict[str, Any]:
    """The wall time and the CPUs Ray saw (``None`` when Ray was not up in this process)."""
    ray_cpus = None
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        with contextlib.suppress(Exception):  # a cluster that went away: nothing to record
            ray_cpus = ray.cluster_resources().get("CPU")
    return {"ray_cpus": ray_cpus, "wall_s": round(wall_s, 2)}


def with_claims(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its method's claims evaluated into ``data["claims"]`` (replacing any)."""
    from nshot.claims import evaluate

    data = dict(data)
    data["claims"] = evaluate(get(data["method"]).claims, data)
    return data


def _fmt(v: float | None, std: float | None) -> str:
    if v is None:
        return "n/a"
    s = f"{v:.4g}"
    if std is not None:
        s += f" ± {std:.2g}"
    return s


def to_markdown(data: dict[str, Any]) -> str:
    metrics = list(data["metrics"])
    arrows = {m: ("↑" if data["metrics"][m]["higher_is_better"] else "↓") for m in metrics}
    lines = [
        f"# {data['method']} — preset `{data['preset']}`",
        "",
        f"Seeds: {data['seeds']}; runtime {data['runtime_s']:.0f} s. "
        "Values are means; ± is the standard deviation (see notes). n/a: not applicable.",
        "",
        *([run_line(data["run"]), ""] if data.get("run") else []),
        "| system | " + " | ".join(f"{m} {arrows[m]}" for m in metrics) + " |",
        "|---|" + "---|" * len(metrics),
    ]
    for system, row in data["rows"].items():
        cells = [_fmt(row.get(m), row.get(f"{m}_std")) for m in metrics]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    if data.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in data["notes"]]
    if data.get("claims"):
        from nshot.claims import to_markdown as claims_markdown

        lines += ["", claims_markdown(data["claims"]).rstrip("\n")]
    extra_md = data.get("extra", {}).get("markdown")
    if extra_md:
        lines += ["", extra_md]
    return "\n".join(lines) + "\n"


def run_line(run: dict[str, Any]) -> str:
    """One line on a run's provenance: date, commit and tree, wall time, CPUs and load."""
    from nshot.provenance import run_commit

    commit, dirty = run_commit(run)
    parts = [f"Run {run.get('date') or 'on an unknown date'}"]
    if commit:
        tree = {True: "dirty tree", False: "clean tree"}.get(dirty)  # type: ignore[arg-type]
        parts[0] += f" at commit {commit[:12]}" + (f" ({tree})" if tree else "")
    if run.get("wall_s") is not None:
        parts.append(f"wall {float(run['wall_s']):.0f} s")
    if run.get("cpu_count"):
        cpus = f"{run['cpu_count']} CPUs"
        if run.get("ray_cpus"):
            cpus += f" (Ray saw {run['ray_cpus']:g})"
        load = run.get("loadavg_start")
        if load:
            cpus += f", load average {load[0]:g} at start"
        parts.append(cpus)
    return "; ".join(parts) + "."


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    metrics = list(data["metrics"])
    systems = list(data["rows"])
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.4), squeeze=False)
    colors = plt.cm.tab10(np.arange(len(systems)) % 10)
    for ax, m in zip(axes[0], metrics):
        vals = [data["rows"][s].get(m) for s in systems]
        errs = [data["rows"][s].get(f"{m}_std") or 0.0 for s in systems]
        x = np.arange(len(systems))
        heights = [v if v is not None else 0.0 for v in vals]
        ax.bar(x, heights, yerr=errs, color=colors, capsize=2)
        for xi, v in zip(x, vals):
            if v is None:
                ax.text(xi, 0, "n/a", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, systems, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{m} ({'↑' if data['metrics'][m]['higher_is_better'] else '↓'})", fontsize=8)
    fig.suptitle(f"{data['method']} ({data['preset']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- every method


def up_to_date(name: str, path: Path, preset: str) -> str | None:
    """Why the results at ``path`` need no re-run (``None``: they do): they are the plain
    ``preset`` reproduction (no overrides, the main comparison) and fresh
    (:func:`nshot.provenance.freshness`: a clean tree, no change to the code since)."""
    from nshot.provenance import freshness

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("preset") != preset or data.get("experiment"):
        return None
    run_block = data.get("run") or {}
    if run_block.get("overrides"):
        return None
    fresh = freshness(name, data)
    return f"fresh: {fresh.detail}" if fresh.state == "fresh" else None


def on_cluster() -> bool:
    """Whether ``--all`` fans the methods out as Ray tasks: ``RAY_ADDRESS`` names a cluster
    and the jobs are not asked to run in this process."""
    from nshot.experiment import in_process

    return bool(os.environ.get("RAY_ADDRESS")) and not in_process()


def plan(method_name: str, cfg: MethodConfig, scale: str | None = None) -> dict[str, Any]:
    """The jobs ``nshot reproduce`` would run for ``method_name`` on ``cfg`` at ``scale``,
    without running any (``nshot reproduce --dry-run``): each with its CPUs, GPUs, torch
    threads and memory, and whether it trains a network.

    The comparison is called in planning mode (:func:`nshot.experiment.planning`): what it
    submits ahead and its grid are recorded, and it stops at the grid. A comparison with later
    phases (jobs built from an earlier phase's results) lists its first phase; ``phases``
    says so. A comparison that submitted nothing is reported with ``jobs: []``."""
    from nshot.experiment import JobScale, PlanComplete, planning, scaled

    method = get(method_name)
    job_scale = JobScale.preset(scale) if scale else None
    stopped = False
    with (
        tempfile.TemporaryDirectory(prefix=f"nshot-plan-{method_name}-") as workdir,
        scaled(job_scale),
        planning() as jobs,
        contextlib.redirect_stdout(sys.stderr),  # stdout carries the plan alone
    ):
        try:
            method.experiments(cfg, Path(workdir))
        except PlanComplete:
            stopped = True
    return {
        "method": method_name,
        "preset": cfg.preset,
        "scale": None
        if job_scale is None
        else {"name": scale, "cpus": job_scale.cpus, "gpus": job_scale.gpus},
        "phases": "first" if stopped else "all",
        "jobs": jobs,
        "totals": {
            "jobs": len(jobs),
            "training_jobs": sum(1 for j in jobs if j["trains"]),
            "gpu_jobs": sum(1 for j in jobs if j["gpus"] > 0),
            "cpus": sum(j["cpus"] for j in jobs),
            "gpus": sum(j["gpus"] for j in jobs),
        },
    }


def run_all(
    preset: str = "small",
    out: str | Path | None = None,
    *,
    only: list[str] | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every registered method's reproduction (or those of ``only``), into its committed
    ``methods/<name>/results/`` folder, or ``out/<name>/`` when ``out`` is given.

    A method whose results there are up to date (:func:`up_to_date`) is skipped unless
    ``force``; a method that fails is reported and the others go on. Here the methods run one
    after another; when ``RAY_ADDRESS`` names a cluster (:func:`on_cluster`) each runs as one
    Ray task (``num_cpus=1``: its own comparison then asks the cluster for its jobs' CPUs),
    writes into a scratch folder on its node and sends its files back. Writing into
    ``methods/*/results/`` needs a clean tree (checked before any work). Returns one
    ``{"name", "status": "made" | "skipped" | "failed", "path", "detail"}`` per method."""
    from nshot.extras import MethodExtraError
    from nshot.provenance import git_state, refuse_dirty

    names = available()
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise NshotError(f"--only: unknown method(s) {unknown}; known: {', '.join(names)}")
        names = [n for n in names if n in only]
    dests: dict[str, Path] = {}
    stems: dict[str, str] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    for name in list(names):
        try:
            method = get(name)
        except MethodExtraError as err:  # not installed here: named with --only, it is an error
            if only:
                raise
            outcomes[name] = {"name": name, "status": "skipped", "path": None, "detail": str(err)}
            log(f"{name}: skipped, {err}")
            names.remove(name)
            continue
        cfg = method.config(preset)  # an unknown preset fails here, before any work
        dests[name] = (
            Path(out).expanduser().resolve() / name if out is not None else method_results_dir(name)
        )
        stems[name] = results_stem(name, cfg, dests[name])
    for dest in dests.values():
        refuse_dirty(dest)
    git = git_state()
    todo = []
    for name in names:
        path = dests[name] / f"{stems[name]}.json"
        why = None if force else up_to_date(name, path, preset)
        if why:
            outcomes[name] = {"name": name, "status": "skipped", "path": path, "detail": why}
            log(f"{name}: skipped, {why} (--force re-makes it)")
        else:
            todo.append(name)
    if todo and on_cluster():
        outcomes.update(_run_on_cluster(todo, preset, dests, stems, git, log))
    else:
        for i, name in enumerate(todo, 1):
            log(f"{name}: reproducing `{preset}` ({i} of {len(todo)}) into {dests[name]}")
            path = dests[name] / f"{stems[name]}.json"
            try:
                run(name, get(name).config(preset), dests[name], {}, git=git)
            except Exception as err:  # noqa: BLE001 - reported; the other methods go on
                outcomes[name] = _failed(name, path, err, log)
                continue
            outcomes[name] = {"name": name, "status": "made", "path": path, "detail": ""}
    return [outcomes[n] for n in available() if n in outcomes]


def _failed(name: str, path: Path, err: BaseException, log: Callable[[str], None]) -> dict:
    detail = f"{type(err).__name__}: {' '.join(str(err).split())}"[:500]
    log(f"{name}: failed, {detail}")
    return {"name": name, "status": "failed", "path": path, "detail": detail}


def _reproduce_remotely(name: str, preset: str, git: dict[str, Any]) -> dict[str, bytes]:
    """One method's reproduction on a cluster node, in a scratch folder: its results files and
    plots, to be written by the caller."""
    with tempfile.TemporaryDirectory(prefix=f"nshot-{name}-") as d:
        run(name, get(name).config(preset), d, {}, git=git)
        return {
            p.name: p.read_bytes()
            for p in sorted(Path(d).iterdir())
            if p.is_file() and (p.name in ("results.json", "results.md") or p.suffix == ".png")
        }


def _install(files: dict[str, bytes], dest: Path, stem: str) -> None:
    """A remote run's files written into ``dest`` under ``stem`` (``results.json`` ->
    ``<stem>.json``, another plot ``x.png`` -> ``<stem>-x.png``)."""
    dest.mkdir(parents=True, exist_ok=True)
    for fname, blob in files.items():
        base, ext = fname.rsplit(".", 1)
        if base == "results":
            target = f"{stem}.{ext}"
        elif stem == "results" or base.startswith(f"{stem}-"):
            target = fname
        else:
            target = f"{stem}-{fname}"
        (dest / target).write_bytes(blob)


def _run_on_cluster(
    names: list[str],
    preset: str,
    dests: dict[str, Path],
    stems: dict[str, str],
    git: dict[str, Any],
    log: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    import ray

    from nshot.train.runner import ensure_ray

    ensure_ray()
    task = ray.remote(num_cpus=1)(_reproduce_remotely)
    pending = {task.remote(n, preset, git): n for n in names}
    log(f"{len(names)} reproductions submitted to the cluster as Ray tasks")
    outcomes: dict[str, dict[str, Any]] = {}
    while pending:
        [ref], _ = ray.wait(list(pending), num_returns=1)
        name = pending.pop(ref)
        path = dests[name] / f"{stems[name]}.json"
        try:
            _install(ray.get(ref), dests[name], stems[name])
        except Exception as err:  # noqa: BLE001 - reported; the other methods go on
            outcomes[name] = _failed(name, path, err, log)
            continue
        log(f"{name}: done, {path}")
        outcomes[name] = {"name": name, "status": "made", "path": path, "detail": ""}
    return outcomes
