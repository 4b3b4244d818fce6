"""`nshot reproduce`: run a method's ``experiments()`` and write results.json, results.md and a PNG.

results.json has the same schema for every method::

    {"method": str, "preset": str, "seeds": int,
     "metrics": {name: {"higher_is_better": bool}},
     "rows": {system: {metric: float | null, "<metric>_std": float | null}},
     "runtime_s": float, "notes": [str], "extra": {...},
     "samples": {system: {metric: [float | null, ...]}},      # when the method keeps them
     "claims": [{"id", "statement", "source", "expr", "holds": bool | null,
                 "lhs", "rhs", "p"}],
     "run": {"date", "commit", "nshot_version",
             "versions": {"python": str, distribution: str | null}}}

``run.versions`` holds the versions of the packages that produced the numbers: the platform's
own (:data:`BASE_PACKAGES`) and the method's ``packages`` (``null``: not installed). Before it
runs, ``nshot reproduce`` compares them with the committed results of the same method and
preset (``methods/<name>/results/<preset>.json``) and warns about every difference, so that a
rerun that reads differently says why it may.

``null`` marks a system that cannot be evaluated on a metric (for example a fixed-slot
model asked for more classes than it has slots).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from nshot.method import MethodConfig, ResultsTable, get

# the platform's packages whose versions can move any method's numbers
BASE_PACKAGES = ("nshot", "torch", "numpy", "scipy", "scikit-learn", "ray", "transformers")


def run(method_name: str, cfg: MethodConfig, out: str | Path) -> dict[str, Any]:
    method = get(method_name)
    out = Path(out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    for line in version_drift(method_name, cfg.preset, experiment_of(cfg)):
        print(f"[nshot reproduce] warning: {line}", file=sys.stderr, flush=True)
    t0 = time.time()
    table = method.experiments(cfg, out)
    if not table.runtime_s:
        table.runtime_s = time.time() - t0
    return write(table, out)


def write(table: ResultsTable, out: Path) -> dict[str, Any]:
    data = with_claims(table.to_json())
    data["run"] = run_info(data["method"])
    (out / "results.json").write_text(json.dumps(data, indent=1))
    (out / "results.md").write_text(to_markdown(data))
    plot(data, out / "results.png")
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


def method_results_dir(name: str) -> Path:
    """The ``results`` folder inside a registered method's package (the committed results)."""
    import inspect

    return Path(inspect.getfile(type(get(name)))).parent / "results"


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


def run_info(method_name: str | None = None) -> dict[str, Any]:
    """When and from what code a reproduction ran: UTC date, nshot's version, the git commit of
    the source tree when nshot runs from a checkout (``+dirty`` with local edits), and the
    versions of the packages that produced the numbers (:func:`package_versions`)."""
    import datetime
    import subprocess

    from nshot import __version__

    here = Path(__file__).resolve().parent
    commit = None
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
            timeout=10, check=False,
        )  # fmt: skip
        if head.returncode == 0 and head.stdout.strip():
            commit = head.stdout.strip()
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                capture_output=True, text=True, timeout=10, check=False,
            )  # fmt: skip
            if dirty.stdout.strip():
                commit += "+dirty"
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "commit": commit,
        "nshot_version": __version__,
        "versions": package_versions(method_name),
    }


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
