"""The ``nshot`` command line: list, train, eval, tune, history, reproduce, claims, report, bench,
serve, cluster, quickstart, new.

Every command takes ``--json`` for machine-readable output on stdout; human output and
progress go to stderr/stdout through ``rich``. Errors that are the user's to fix (bad config,
unknown method, corrupt checkpoint, existing run, a run name outside the storage, a port in
use) print one line and exit with status 2, checked before Ray starts where they can be.
Ctrl-C prints one line (for ``train``: where the last checkpoint is and the command that
resumes the run) and exits with status 130.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from nshot.errors import NshotError, StorageError
from nshot.method import parse_overrides

#: the width of rich's output off a terminal: wide enough that no line is wrapped (a Markdown
#: table redirected to a file stays one line per row)
UNWRAPPED = 1 << 16


def _console():
    """rich's console on stdout: on a terminal as wide as the terminal; off a terminal (a pipe,
    a file) without colour (rich's own rule) and without wrapping lines."""
    from rich.console import Console

    console = Console(stderr=False, highlight=False)
    if console.is_terminal:
        return console

    class Unwrapped(Console):
        def rule(self, title="", *, characters="─", style="rule.line", align="center") -> None:
            from rich.rule import Rule

            rule = Rule(title, characters=characters, style=style, align=align)
            self.print(rule, width=80)  # a rule fills the width it is given

    return Unwrapped(stderr=False, highlight=False, width=UNWRAPPED, soft_wrap=True)


class _NoAnsi:
    """A text stream that drops ANSI escape sequences (colours, cursor moves) from what is
    written to it: nshot's stdout and stderr when they are not a terminal, so that the lines
    other libraries colour (Ray's worker and log prefixes, its start-up line) arrive plain."""

    def __init__(self, stream: Any) -> None:
        import re

        self._stream = stream
        self._sequence = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")

    def write(self, text: str) -> int:
        self._stream.write(self._sequence.sub("", text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _colour_off(stream: Any) -> bool:
    """No colour on ``stream``: it is not a terminal (or ``NO_COLOR`` is set), unless
    ``FORCE_COLOR`` is set (the variables rich honours too)."""
    if os.environ.get("FORCE_COLOR"):
        return False
    if os.environ.get("NO_COLOR") is not None:
        return True
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


@contextlib.contextmanager
def _plain_output():
    """While a command runs: stdout and stderr drop ANSI sequences where colour is off, and
    Ray prints its worker lines' prefixes without colour (``RAY_COLOR_PREFIX=0``, unless set)
    when stdout is not a terminal."""
    saved = sys.stdout, sys.stderr
    prefix_set = _colour_off(sys.stdout) and "RAY_COLOR_PREFIX" not in os.environ
    if prefix_set:
        os.environ["RAY_COLOR_PREFIX"] = "0"
    if _colour_off(sys.stdout):
        sys.stdout = _NoAnsi(sys.stdout)
    if _colour_off(sys.stderr):
        sys.stderr = _NoAnsi(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        if prefix_set:
            os.environ.pop("RAY_COLOR_PREFIX", None)


# A line Ray prints although nothing is wrong, at the end of each `nshot` command that serves
# (quickstart, serve, bench): Serve's shutdown call to its controller ends with the controller
# killed, and the core worker reports that call to the driver as an error, "(raylet) Task
# ServeController.graceful_shutdown failed. There are infinite retries remaining, ..."
SERVE_SHUTDOWN_LINE = ("ServeController.graceful_shutdown failed", "killed by `ray.kill`")


def _quiet_serve_shutdown() -> None:
    """Drop :data:`SERVE_SHUTDOWN_LINE` from the error messages Ray prints on the driver (its
    thread that listens for errors prints them through ``print_to_stdstream``); every other line
    is printed as Ray prints it, and ``NSHOT_VERBOSE=1`` keeps them all."""
    if os.environ.get("NSHOT_VERBOSE", "").lower() in ("1", "true", "yes"):
        return
    try:
        from ray._private import worker as ray_worker

        printer = ray_worker.print_to_stdstream
    except (ImportError, AttributeError):  # another Ray version: the line stays
        return
    if getattr(printer, "_nshot_quiet", False):
        return

    def quiet(data: dict[str, Any], ignore_prefix: bool) -> None:
        lines = [
            line
            for line in data.get("lines", [])
            if not all(part in line for part in SERVE_SHUTDOWN_LINE)
        ]
        if lines:
            printer({**data, "lines": lines}, ignore_prefix=ignore_prefix)

    quiet._nshot_quiet = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = quiet


def _emit(args: argparse.Namespace, payload: Any, human: str | None = None) -> None:
    if getattr(args, "json", False):
        print(json.dumps(payload, indent=1, default=str))
    elif human is not None:
        _console().print(human)


def _add_config_args(p: argparse.ArgumentParser, preset_default: str = "small") -> None:
    p.add_argument(
        "--preset",
        default=preset_default,
        help="smoke | small | paper, or one a method adds (`nshot list` shows them)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (repeatable); values parse as JSON when they can",
    )
    p.add_argument(
        "--allow-download",
        action="store_true",
        help="LLM methods: let Hugging Face fetch a hub model (offline by default)",
    )


def _config(method_name: str, args: argparse.Namespace):
    """The config of ``--preset`` with the ``--set`` fields; an unknown method, preset or field
    is one error naming a close one."""
    method = _method(method_name)
    overrides = parse_overrides(args.overrides)
    if getattr(args, "allow_download", False):
        overrides["allow_download"] = True  # a method without model downloads rejects it
    _check_preset(method, args.preset)
    _check_fields(method.Config, overrides, "--set")
    return method.config(args.preset, **overrides)


def _method(name: str):
    """The registered method ``name``; an unknown name is an error naming a close method."""
    from nshot.method import UnknownMethodError, available, get

    try:
        return get(name)
    except UnknownMethodError:
        names = available()
        raise UnknownMethodError(
            f"unknown method {name!r}{did_you_mean(name, names)}; available: {', '.join(names)}"
        ) from None


def _check_preset(method, preset: str) -> None:
    from nshot.errors import ConfigError

    presets = sorted(method.Config.PRESETS)
    if preset not in presets:
        raise ConfigError(
            f"--preset: {method.name} has no preset {preset!r}{did_you_mean(preset, presets)}; "
            f"choose one of {', '.join(presets)}"
        )


def _check_fields(config_class, overrides: dict[str, Any], option: str) -> None:
    """Every key of ``overrides`` is a field of ``config_class`` (else an error naming a close
    field; the values are validated with the config)."""
    from nshot.errors import ConfigError

    fields = sorted(config_class.model_fields)
    for key in overrides:
        if key not in config_class.model_fields:
            close = did_you_mean(key, fields)
            raise ConfigError(
                f"{option} {key}=...: {config_class.__name__}: field {key!r}: unknown field"
                + (close or f"; the fields: {', '.join(fields)}")
            )


# --------------------------------------------------------------------------- commands


def cmd_list(args: argparse.Namespace) -> int:
    from nshot.method import available, describe

    rows = [describe(n) for n in available()]  # also those whose extra is not installed
    if args.json:
        _emit(args, rows)
        return 0
    from rich.table import Table

    t = Table(title="nshot methods")
    for col in ("name", "area", "presets", "paper"):
        t.add_column(col)
    for r in rows:
        name = r["name"] + (f" (needs nshot[{r['extra']}])" if r.get("missing") else "")
        t.add_row(name, r["area"], ", ".join(r["presets"]), r["paper"])
    _console().print(t)
    return 0


def _scaling(args: argparse.Namespace):
    from nshot.errors import ConfigError
    from nshot.train import Scaling
    from nshot.train.runner import SCALE_PRESETS

    if args.scale:
        if args.scale not in SCALE_PRESETS:
            raise ConfigError(
                f"--scale: unknown preset {args.scale!r}{did_you_mean(args.scale, SCALE_PRESETS)}"
                f"; choose one of {', '.join(SCALE_PRESETS)}"
            )
        s = Scaling.preset(args.scale)
        if args.workers is not None:
            s.workers = args.workers
    else:
        s = Scaling(workers=args.workers or 0)
    if args.gpus_per_worker is not None:
        s.gpus_per_worker = args.gpus_per_worker
    if args.cpus_per_worker is not None:
        s.cpus_per_worker = args.cpus_per_worker
    return s


def cmd_train(args: argparse.Namespace) -> int:
    from nshot.train import fit

    cfg = _config(args.method, args)
    try:
        res = fit(
            args.method,
            cfg,
            scaling=_scaling(args),
            storage=args.storage,
            name=args.name,
            resume=args.resume,
            overwrite=args.overwrite,
            max_failures=args.max_failures,
            allow_earlier=args.allow_earlier_checkpoint,
            verbose=args.verbose,
        )
    except KeyboardInterrupt:
        print(f"nshot: interrupted: {_interrupted_train(args, cfg)}", file=sys.stderr)
        return 130
    except StorageError as err:  # one line (main), told with this command line's own spelling
        raise _storage_stopped(args, cfg, err) from err.__cause__
    payload = {
        "run_dir": str(res.run_dir),
        "checkpoint": str(res.checkpoint) if res.checkpoint else None,
        "metrics": res.metrics,
        "wall_s": res.wall_s,
    }
    _emit(
        args,
        payload,
        f"[bold]trained[/bold] {args.method} ({cfg.preset}) in {res.wall_s:.1f}s\n"
        f"checkpoint: {payload['checkpoint']}\nfinal metrics: {_short(res.metrics)}"
        + (f"\nRay's own logs of this run: {res.ray_logs}" if res.ray_logs else "")
        + (f"\nRay's session logs: {ray_logs}" if (ray_logs := _ray_logs()) else ""),
    )
    return 0


def _storage_stopped(args: argparse.Namespace, cfg, err: StorageError) -> StorageError:
    """``err`` (a run stopped by a storage error) with the command that continues the run as
    this command line spells it; with ``--verbose`` (or ``NSHOT_VERBOSE=1``) the traceback
    (the worker's, inside Ray Train's error) is printed first."""
    if args.verbose or os.environ.get("NSHOT_VERBOSE", "").lower() in ("1", "true", "yes"):
        import traceback

        traceback.print_exception(err, file=sys.stderr)
        fault = getattr(err, "fault", None)
        if getattr(fault, "worker_traceback", None):
            print(f"The worker's traceback:\n{fault.worker_traceback}", file=sys.stderr)
    with_command = getattr(err, "with_command", None)
    if with_command is None:
        return err
    name = args.name if args.name is not None else f"{args.method}-{cfg.preset}"
    argv = [a for a in getattr(args, "argv", None) or [] if a not in ("--overwrite", "--resume")]
    if args.name is None:
        argv += ["--name", name]
    return with_command(["nshot", *argv, *(["--resume"] if err.resume else [])])


def _interrupted_train(args: argparse.Namespace, cfg) -> str:
    """Where an interrupted run's last checkpoint is, and the command that continues it."""
    import shlex

    from nshot.train.checkpoint import find_checkpoints
    from nshot.train.runner import resolve_storage

    name = args.name if args.name is not None else f"{args.method}-{cfg.preset}"
    argv = [a for a in getattr(args, "argv", None) or [] if a != "--overwrite"]
    if args.name is None:
        argv += ["--name", name]
    try:
        run_dir = resolve_storage(args.storage)
        run_dir = run_dir / name if isinstance(run_dir, Path) else f"{run_dir}/{name}"
    except Exception:  # noqa: BLE001 - the message must come out whatever the storage is
        return "training stopped before its run directory was known"
    if not isinstance(run_dir, Path):
        return f"run {run_dir} stopped; resume with: " + shlex.join(
            ["nshot", *argv, *([] if "--resume" in argv else ["--resume"])]
        )
    try:
        found = find_checkpoints(run_dir) if run_dir.is_dir() else []
    except Exception:  # noqa: BLE001
        found = []
    if not found:
        has_run = run_dir.is_dir() and any(run_dir.iterdir())
        again = [*argv, "--resume"] if has_run and "--resume" not in argv else argv
        return f"no checkpoint was written in {run_dir}; start again with: " + shlex.join(
            ["nshot", *again]
        )
    if "--resume" not in argv:
        argv.append("--resume")
    return f"run {run_dir} stopped; last checkpoint: {found[-1]}; resume with: " + shlex.join(
        ["nshot", *argv]
    )


def _ray_logs() -> str | None:
    from nshot.train.runner import ray_logs_dir

    return ray_logs_dir()


def _short(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, int | float))


def _earlier(args: argparse.Namespace) -> dict[str, Any]:
    """``allow_earlier=True`` for the checkpoint loaders when the flag is given."""
    return {"allow_earlier": True} if getattr(args, "allow_earlier_checkpoint", False) else {}


def _eval_config(method, ckpt, overrides: dict[str, Any]):
    """The checkpoint's config with ``overrides``; a field outside ``EVAL_FIELDS`` may only be
    set to the checkpoint's own value (it shapes the model the weights belong to)."""
    from nshot.errors import ConfigError

    base = method.config_from_dict(ckpt.config)
    if not overrides:
        return base
    cfg = base.replace(**overrides)  # an unknown field or a bad value is named here
    allowed = type(base).EVAL_FIELDS
    for key in overrides:
        if key not in allowed and getattr(cfg, key) != getattr(base, key):
            fixed = json.dumps(getattr(base, key), default=str)
            raise ConfigError(
                f"{type(base).__name__}: field {key!r} shapes the model and is fixed by the "
                f"checkpoint ({fixed}); nshot eval may override only {', '.join(sorted(allowed))}"
            )
    return cfg


def cmd_eval(args: argparse.Namespace) -> int:
    from nshot.train import load_checkpoint

    method = _method(args.method)  # an unknown method is named before anything is read
    overrides = parse_overrides(args.overrides)
    _check_fields(method.Config, overrides, "--set")
    ckpt = load_checkpoint(args.checkpoint, method=method.name, **_earlier(args))
    cfg = _eval_config(method, ckpt, overrides)
    metrics = method.evaluate(ckpt, cfg)
    payload = {"checkpoint": str(ckpt.path), "metrics": metrics}
    if args.json:
        _emit(args, payload)
    else:
        from rich.table import Table

        t = Table(title=f"{method.name} evaluation ({ckpt.path})")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k, v in metrics.items():
            t.add_row(k, f"{v:.4f}")
        _console().print(t)
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from nshot import reproduce

    if args.all or args.only:
        return _reproduce_all(args)
    if args.method is None:
        raise NshotError("name a method to reproduce, or --all (`nshot list` shows them)")
    cfg = _config(args.method, args)
    if args.scale is not None:
        from nshot.train import Scaling

        Scaling.preset(args.scale)  # an unknown name fails here, naming the presets
    if args.dry_run:
        print(json.dumps(reproduce.plan(args.method, cfg, args.scale), indent=1))
        return 0
    out = Path(args.out or f"results/{args.method}-{cfg.preset}")
    if args.in_process:
        os.environ["NSHOT_IN_PROCESS"] = "1"
    overrides = parse_overrides(args.overrides)
    if getattr(args, "allow_download", False):
        overrides["allow_download"] = True
    data = reproduce.run(args.method, cfg, out, overrides, scale=args.scale)
    _emit(
        args,
        data,
        reproduce.to_markdown(data) + f"\nwrote {out}/results.json, results.md, results.png",
    )
    from nshot.claims import summary_line

    print(summary_line(data["claims"]), file=sys.stderr if args.json else sys.stdout)
    return 0


def _reproduce_all(args: argparse.Namespace) -> int:
    """``nshot reproduce --all``: every method (or ``--only``) one after another here, or one
    Ray task each on the cluster ``RAY_ADDRESS`` names; then the report and a scoreboard."""
    from nshot import report, reproduce

    if args.method is not None:
        raise NshotError(f"--all/--only and a method ({args.method}) exclude each other")
    if args.overrides:
        raise NshotError("--set applies to one method's config: not with --all/--only")
    if args.in_process:
        os.environ["NSHOT_IN_PROCESS"] = "1"
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    outcomes = reproduce.run_all(
        args.preset,
        args.out,
        only=only,
        force=args.force,
        log=lambda line: print(f"[nshot reproduce] {line}", file=sys.stderr, flush=True),
    )
    out = Path(args.out).expanduser() if args.out else None
    made = [o for o in outcomes if o["path"] is not None and o["path"].is_file()]
    entries = []
    if made:
        entries = report.gather(preset=args.preset, results=[out] if out else None)
        report_dir = (out / "report") if out else report.default_out()
        index = report.write(entries, report_dir)
        print(f"wrote {index} and {index.parent / 'report.md'}", file=sys.stderr)
    by_name = {e.name: e for e in entries}
    shown = [by_name[o["name"]] for o in outcomes if o["name"] in by_name]
    lines = dict(zip((e.name for e in shown), report.scoreboard_lines(shown), strict=True))
    board = sys.stderr if args.json else sys.stdout  # with --json, stdout carries the JSON
    for o in outcomes:
        line = lines.get(o["name"], o["name"])
        tag = {"made": "made", "skipped": "skipped", "failed": "FAILED"}[o["status"]]
        failed = f"  ({o['detail']})" if o["status"] == "failed" or o["path"] is None else ""
        print(f"{tag:<7}  {line}{failed}", file=board)
    if args.json:
        rows = [{**o, "path": None if o["path"] is None else str(o["path"])} for o in outcomes]
        print(json.dumps(rows, indent=1))
    return 1 if any(o["status"] == "failed" for o in outcomes) else 0


def cmd_claims(args: argparse.Namespace) -> int:
    """Re-evaluate a method's claims on an existing results.json (no rerun): a path, or a
    method's name for its committed results of ``--preset``."""
    from nshot import reproduce
    from nshot.claims import summary_line, to_markdown

    path = Path(args.results).expanduser()
    if not path.exists() and os.sep not in args.results and not path.suffix:
        method = _method(args.results)  # a name, not a path: an unknown one is named
        path = reproduce.method_results_dir(method.name) / f"{args.preset}.json"
        if not path.is_file():
            committed = sorted(p.stem for p in path.parent.glob("*.json"))
            raise NshotError(
                f"{method.name} has no committed results of preset {args.preset!r}"
                f"{did_you_mean(args.preset, committed)} ({path}); committed: "
                f"{', '.join(committed) or 'none'} (--preset), or give a results.json"
            )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise NshotError(f"{path}: cannot read results JSON: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("method"), str):
        raise NshotError(f"{path}: not an nshot results.json (no 'method')")
    data = reproduce.with_claims(data)
    if args.write:
        path.write_text(json.dumps(data, indent=1))
        md = path.with_suffix(".md")
        md.write_text(reproduce.to_markdown(data))
    if args.json:
        _emit(args, data["claims"])
    else:
        _console().print(to_markdown(data["claims"]), markup=False)
    # with --json, stdout carries only the JSON
    print(summary_line(data["claims"]), file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from nshot import report

    entries = report.gather(preset=args.preset, results=args.results)
    if args.readme:
        changed = report.update_readme(args.readme, entries)
        print(f"{'updated' if changed else 'unchanged'}: the method table of {args.readme}")
    out = args.out or (report.default_out() if not args.results else "nshot-report")
    index = report.write(entries, out)
    with_results = [e for e in entries if e.data is not None]
    heads = sum(1 for e in with_results if e.counts["headline"]["verdict"] is True)
    paper = [e.counts["paper"] for e in with_results]
    checks = [e.counts["checks"] for e in with_results]
    stale = sum(1 for e in with_results if e.stale)
    print(
        f"wrote {index} and {index.parent / 'report.md'}: {len(with_results)} methods with "
        f"results; claims: the headline holds for {heads} of them; "
        f"{sum(c['held'] for c in paper)} of {sum(c['total'] for c in paper)} paper claims hold; "
        f"{sum(c['held'] for c in checks)} of {sum(c['total'] for c in checks)} checks hold; "
        f"{stale} stale result(s)"
    )
    for line in report.scoreboard_lines(with_results):
        print(f"  {line}")
    return 0


#: ``nshot bench --ingress``: the ingress modes (nshot.serve.ingress)
INGRESS = ("proxy", "direct", "throughput", "haproxy")


def _numbers(option: str, text: str, kind: type) -> tuple:
    """A comma-separated ``--option`` value as numbers of ``kind`` (else one error line)."""
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise NshotError(f"{option} {text!r}: give comma-separated {what}, e.g. 1,8,32") from None


def _check_bench(args: argparse.Namespace) -> None:
    """What a benchmark reads of the command line, checked before it starts Ray."""
    if args.what in ("train", "serve", "serve-sustained", "serve-ramp"):
        method = _method(args.method)
        if args.what == "train":
            _check_preset(method, args.preset)
    args.levels_n = _numbers("--levels", args.levels, int)
    args.replicas_n = _numbers("--replicas", args.replicas, int)
    args.batch_wait_n = (
        _numbers("--batch-wait-ms", args.bench_batch_wait_ms, float)
        if args.bench_batch_wait_ms
        else ()
    )
    args.ingress_n = tuple(args.ingress.split(","))
    for mode in args.ingress_n:
        if mode not in INGRESS:
            raise NshotError(
                f"--ingress: unknown ingress {mode!r}{did_you_mean(mode, INGRESS)}; choose from "
                f"{', '.join(INGRESS)}"
            )


def cmd_bench(args: argparse.Namespace) -> int:
    from nshot import bench

    _check_bench(args)
    if args.what.startswith("serve"):
        _quiet_serve_shutdown()
    if args.what == "train":
        data = bench.train(args.method, preset=args.preset, steps=args.steps, out=args.out)
    elif args.what == "deepspeed":
        data = bench.deepspeed(workers=args.workers, shape=args.shape, out=args.out)
    elif args.what == "serve":
        data = bench.serve(
            args.method,
            checkpoint=args.checkpoint,
            requests=args.requests or 200,
            repeats=args.repeats,
            concurrency=args.levels_n,
            ingress=args.ingress_n,
            replicas=args.replicas_n,
            batch_wait_ms=args.batch_wait_n,
            out=args.out,
        )
        if not args.json:  # the table and the ratios; every run is in the JSON file
            print(bench.serve_table(data))
            return 0
    elif args.what == "serve-sustained":
        data = bench.sustained(
            args.method,
            checkpoint=args.checkpoint,
            requests=args.requests or 10_000,
            clients=args.clients,
            out=args.out,
        )
    elif args.what == "serve-ramp":
        try:
            phases = tuple(
                (int(c), float(sec)) for c, sec in (p.split("x") for p in args.phases.split(","))
            )
        except ValueError:
            raise NshotError(
                f"--phases {args.phases!r}: give CLIENTSxSECONDS pairs, e.g. 1x20,64x90,1x30"
            ) from None
        data = bench.serve_ramp(
            args.method,
            checkpoint=args.checkpoint,
            autoscale=args.autoscale,
            phases=phases,
            out=args.out,
        )
    else:  # a method's own benchmark (nshot bench tail), or one error line naming the choices
        data = bench.method(args.what, preset=args.preset, out=args.out)
    _emit(args, data, json.dumps(data, indent=1))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from nshot.tune.run import tune
    from nshot.tune.space import SearchSpace

    cfg = _config(args.method, args)
    _check_searcher(args.search)
    space = None
    if args.space:
        raw = args.space
        if raw.startswith("@"):
            raw = Path(raw[1:]).read_text()
        space = SearchSpace.from_json(raw)
    import contextlib

    # with --json, stdout carries only the JSON: Tune's own status tables go to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with quiet:
        res = _run_tune(tune, cfg, space, args)
    payload = res.to_json()
    if args.json:
        _emit(args, payload)
        return 0
    from rich.table import Table

    t = Table(title=f"{args.method} sweep ({args.search}, {len(res.trials)} trials)")
    t.add_column("trial")
    t.add_column("config")
    t.add_column(f"f ({res.metric}, {res.mode})", justify="right")
    t.add_column("reports", justify="right")
    for o in res.trials:
        cfg_s = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in o.config.items()
        )
        t.add_row(o.trial_id, cfg_s, "-" if o.f is None else f"{o.f:.4f}", str(o.reports))
    con = _console()
    con.print(t)
    con.print(f"best f={res.best_f} with {res.best_config} ({res.wall_s:.1f}s)")
    if res.history_path:
        con.print(f"history task: {res.history_path}")
    return 0


def _check_searcher(name: str) -> None:
    """``--search`` names a registered searcher (else an error naming a close one)."""
    from nshot.tune import searchers

    if name in searchers._SEARCHERS:  # the built-in ones, and those of imported methods
        return
    names = searchers.available_searchers()  # imports every method: each may register one
    if name not in names:
        raise searchers.UnknownSearcherError(
            f"--search: unknown searcher {name!r}{did_you_mean(name, names)}; available: "
            f"{', '.join(names)}"
        )


def _run_tune(tune, cfg, space, args: argparse.Namespace):
    return tune(
        args.method,
        cfg,
        search=args.search,
        num_samples=args.num_samples,
        max_concurrent=args.max_concurrent,
        scheduler=args.scheduler,
        space=space,
        scaling=_scaling(args),
        storage=args.storage,
        name=args.name,
        resume=args.resume,
        history_dir=args.history,
        save_history=not args.no_history,
        search_options=parse_overrides(args.search_options),
        seed=args.seed,
        verbose=1 if args.verbose and not args.json else 0,
        progress=not args.json,
        reuse_actors=False if args.no_reuse_actors else None,
    )


def cmd_history(args: argparse.Namespace) -> int:
    from nshot.tune.history import history_dir, load_tasks, summarize

    tasks = load_tasks(args.history, method=args.method)
    if args.method is not None and not tasks and args.method not in method_names():
        _method(args.method)  # no sweep of an unknown method: name a close one
    rows = summarize(tasks)
    if args.json:
        _emit(args, rows)
        return 0
    from rich.table import Table

    t = Table(title=f"sweep history ({history_dir(args.history)})")
    for col in ("task_id", "method", "preset", "trials", "best_f", "space_hash"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            *(
                f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c])
                for c in ("task_id", "method", "preset", "trials", "best_f", "space_hash")
            )
        )
    _console().print(t)
    return 0


def check_serve_address(host: str, port: int) -> None:
    """``--host``/``--port`` can be served on: the port is in 1..65535 and, when nshot starts
    its own Ray (no ``RAY_ADDRESS``), the host is an address of this machine and the port is
    free there (both checked by binding a socket, before Ray starts)."""
    import errno
    import socket

    if not 1 <= port <= 65535:
        raise NshotError(f"--port {port}: a TCP port is in 1..65535")
    if os.environ.get("RAY_ADDRESS"):  # Serve's proxies run on the cluster's nodes
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as err:
        raise NshotError(f"--host {host}: not a known host name or address ({err})") from None
    family, kind, proto, _, addr = infos[0]
    for probe in (0, port):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((addr[0], probe, *addr[2:]))
            except OSError as err:
                why = err.strerror or str(err)
                if probe == 0:
                    raise NshotError(
                        f"--host {host}: not an address of this host ({why}); use 127.0.0.1 "
                        "(this machine only) or 0.0.0.0 (every interface)"
                    ) from None
                if err.errno == errno.EADDRINUSE:
                    raise NshotError(
                        f"--port {port}: {host}:{port} is already in use; choose another --port"
                    ) from None
                raise NshotError(f"--port {port}: cannot listen on {host}:{port} ({why})") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from nshot.serve import ingress
    from nshot.train.checkpoint import load_checkpoint, resolve_checkpoint

    if args.all is not None:
        return _serve_all(args)
    if args.write_config is not None:
        raise NshotError("--write-config goes with --all RUNS_DIR")
    if args.method is None or args.checkpoint is None:
        raise NshotError(
            "nshot serve METHOD --checkpoint PATH serves one checkpoint; nshot serve --all "
            "RUNS_DIR serves every method's newest run"
        )
    method = _method(args.method)  # an unknown method is named before anything is read
    check_serve_address(args.host, args.port)
    token = args.token or os.environ.get("NSHOT_SERVE_TOKEN") or None
    args.ingress = args.ingress or ingress.default_mode()
    ingress.check(args.ingress, token)  # HAProxy without a token or its binary: before Ray
    _check_autoscale(args)
    _check_replica_request(args)
    # the checkpoint is resolved (and verified) here, before Ray starts; the app gets its path
    checkpoint = resolve_checkpoint(args.checkpoint, **_earlier(args))
    load_checkpoint(checkpoint, method=method.name)

    from nshot.serve import start

    _quiet_serve_shutdown()
    opts = _serve_options(args, token)
    url = start(
        method.name,
        str(checkpoint),
        host=args.host,
        port=args.port,
        options=opts,
        ingress=args.ingress,
        drain_s=args.drain_s,
        notify=_serve_note,
    )
    previous = _stop_on_sigterm()  # before the "serving" line that a supervisor waits for
    more = ""
    if args.ingress in ("direct", "throughput"):
        others = [u for u in ingress.targets(method.name, args.host) if u != url]
        more = f"; other replicas: {', '.join(others)}" if others else ""
    _console().print(
        f"serving {args.method} at {url}/predict (metadata: {url}/metadata, health: "
        f"{url}/healthz; ingress {args.ingress}{more}); Ctrl-C stops"
    )
    return _serve_until_stopped(previous)


def _stop_on_sigterm() -> Any:
    """Make SIGTERM (``kill``, a container's stop) raise KeyboardInterrupt, as Ctrl-C does, from
    now on. Installed once Serve is up (Ray's start-up puts a handler of its own on SIGTERM)
    and before the "serving" line is printed: a SIGTERM sent as soon as that line appears shuts
    Serve down and exits 0, never Ray's handler, which aborts the process without shutting
    Serve down. Returns the handler it replaces."""
    import signal

    def _stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, _stop)


def _serve_until_stopped(previous: Any) -> int:
    """Block until Ctrl-C or SIGTERM (:func:`_stop_on_sigterm`), then shut Serve down."""
    import signal
    import time

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        from ray import serve

        serve.shutdown()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _check_autoscale(args: argparse.Namespace) -> None:
    if args.autoscale is not None:
        from nshot.serve.app import parse_autoscale

        if args.replicas != 1:
            raise NshotError("--autoscale MIN:MAX replaces --replicas: give one of them")
        try:
            parse_autoscale(args.autoscale)
        except ValueError as err:
            raise NshotError(f"--{err}") from None


def _check_replica_request(args: argparse.Namespace) -> None:
    """``--replica-cpus``/``--replica-gpus`` are requests Ray can take (before Ray starts)."""
    from nshot.serve.resources import check_request

    check_request(args.replica_cpus, args.replica_gpus)


def _serve_note(line: str) -> None:
    """A line from the Serve glue (the replicas' CPU request, scaled down to fit)."""
    _console().print(line, highlight=False)


def _serve_options(args: argparse.Namespace, token: str | None):
    from nshot.serve.app import ServeOptions

    return ServeOptions(
        max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1000.0,
        token=token,
        num_replicas=args.replicas,
        autoscale=args.autoscale,
        replica_cpus=args.replica_cpus,
        replica_gpus=args.replica_gpus,
        max_ongoing_requests=args.max_ongoing,
        max_queued_requests=args.max_queued,
        conformal=args.conformal,
        alpha=args.alpha,
        conformal_k=args.conformal_k,
    )


def _serve_all(args: argparse.Namespace) -> int:
    """``nshot serve --all RUNS_DIR``: every method's newest run, one Serve instance, one port."""
    from nshot.fileio import atomic_write
    from nshot.serve import start_all
    from nshot.serve.runs import find_runs, serve_config

    if args.method is not None or args.checkpoint is not None:
        raise NshotError("--all RUNS_DIR serves every run it finds: give no METHOD or --checkpoint")
    if args.conformal is not None:
        raise NshotError(
            "--conformal with --all: prediction sets are per application; write the config "
            "(--write-config FILE) and set `conformal: caos` in the args of the classifiers"
        )
    _check_autoscale(args)
    _check_replica_request(args)
    token = args.token or os.environ.get("NSHOT_SERVE_TOKEN") or None
    args.ingress = args.ingress or "proxy"
    runs = find_runs(args.all)
    for run, why in runs.skipped:
        _console().print(f"[yellow]left out[/] {run}: {why}", highlight=False)
    opts = _serve_options(args, token)
    if args.write_config is not None:
        import yaml

        from nshot.serve.resources import fitted

        # fitted to this machine, or to the cluster RAY_ADDRESS names (connected to, not started)
        opts = fitted(opts, len(runs.chosen), start_ray=False, notify=_serve_note)
        config = serve_config(runs.chosen, opts, host=args.host, port=args.port)
        text = (
            f"# nshot serve --all {args.all}: one application per method (serve run FILE).\n"
            "# The token is not written: each application reads $NSHOT_SERVE_TOKEN unless its\n"
            "# args set `token`.\n" + yaml.safe_dump(config, sort_keys=False)
        )
        atomic_write(Path(args.write_config), text)
        _console().print(f"wrote {args.write_config} ({len(runs.chosen)} applications)")
        return 0
    if args.ingress not in ("proxy", "haproxy"):
        raise NshotError(
            f"--ingress {args.ingress}: --all serves every application on one port, behind the "
            "proxy (--ingress proxy, the default with --all) or HAProxy (--ingress haproxy)"
        )
    check_serve_address(args.host, args.port)
    _quiet_serve_shutdown()
    urls = start_all(
        runs.chosen,
        host=args.host,
        port=args.port,
        options=opts,
        ingress=args.ingress,
        drain_s=args.drain_s,
        notify=_serve_note,
    )
    previous = _stop_on_sigterm()
    for method, url in urls.items():
        _console().print(f"serving {method} ({runs.runs[method].name}) at {url}/predict")
    _console().print(f"{len(urls)} applications on one port (ingress {args.ingress}); Ctrl-C stops")
    return _serve_until_stopped(previous)


def cmd_quickstart(args: argparse.Namespace) -> int:
    from nshot.quickstart import run

    _check_preset(_method("tail"), args.preset)
    _quiet_serve_shutdown()
    run(out=Path(args.out), preset=args.preset, console=_console())
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    """``nshot new NAME``: a method package written from the template, and what to do next."""
    from nshot import scaffold

    parent = Path(args.dir) if args.dir else scaffold.default_parent()
    dest = scaffold.new_method(args.name, parent, taken=method_names())
    builtin = parent.resolve() == scaffold.default_parent().resolve() and parent.name == "methods"
    name, cls = args.name, f"{scaffold.camel(args.name)}Method"
    lines = [
        f"wrote {dest}/: {', '.join(scaffold.FILES)}",
        f"a working template: a prototypical-network classifier named {name}; fill it in with "
        "your paper's method (docs/adding-a-method.md walks through each file)",
    ]
    if builtin:
        lines += [
            f"registered as a built-in method (a package of {parent}); for an installed nshot "
            f'also add to pyproject.toml\'s [project.entry-points."nshot.methods"]: '
            f'{name} = "nshot.methods.{name}:{cls}"',
        ]
    else:
        lines += [
            "register it from the package that ships it, in that package's pyproject.toml: "
            f'[project.entry-points."nshot.methods"] {name} = "{name}:{cls}" (or import it '
            "before nshot looks methods up: importing it registers it)",
        ]
    lines += [
        "try it" + ("" if builtin else ", once it is registered") + ":",
        f"  nshot train {name} --preset smoke --workers 0",
        f"  nshot reproduce {name} --preset smoke --in-process --out results/{name}-smoke",
        f"  python -m pytest tests/test_conformance.py -k {name}  # the Method contract's checks",
    ]
    _console().print("\n".join(lines), markup=False)
    return 0


# --------------------------------------------------------------------------- parser

#: ``nshot tune --scheduler``: ASHA, or none (fifo: Tune's name for none)
SCHEDULERS = ("asha", "none", "fifo")


def _version() -> str:
    try:
        from nshot import __version__

        return __version__
    except ImportError:  # pragma: no cover - an nshot without the attribute
        import importlib.metadata

        return importlib.metadata.version("nshot")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when one of ``choices`` is close to ``word``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Parser(argparse.ArgumentParser):
    """argparse, with "did you mean" after an invalid choice or an unknown option, and an
    unknown option reported by the subcommand's parser (its usage, not the top level's)."""

    def error(self, message: str) -> NoReturn:
        import re

        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2))
            message += did_you_mean(m.group(1), choices)
        super().error(message)

    def unrecognized(self, extras: list[str]) -> NoReturn:
        """Refuse the arguments this (sub)parser does not know, naming a close option."""
        options = [
            o
            for a in self._actions
            if a.help != argparse.SUPPRESS
            for o in a.option_strings
            if o.startswith("--")
        ]
        hints = [
            did_you_mean(e.split("=", 1)[0], options).strip() for e in extras if e.startswith("-")
        ]
        hint = next((h for h in hints if h), "")
        self.error(f"unrecognized arguments: {' '.join(extras)}" + (f" {hint}" if hint else ""))


class _Deprecated(argparse.Action):
    """A former spelling of an option: hidden from the help, still accepted, with a one-line
    note on stderr naming the current spelling."""

    def __init__(self, option_strings, dest, current: str, **kwargs) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.current = current

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"nshot: warning: {option_string} is deprecated; use {self.current}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def method_names() -> list[str]:
    """The names :func:`nshot.method.available` returns, read without importing any method (a
    built-in method's name is its package's name): the registered methods, built-in (the
    ``nshot.methods`` packages) and third-party (the ``nshot.methods`` entry points and any
    class registered in this process)."""
    import importlib.metadata
    import pkgutil

    import nshot.method as registry
    import nshot.methods as builtin

    names = {info.name for info in pkgutil.iter_modules(builtin.__path__) if info.ispkg}
    names |= {ep.name for ep in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    return sorted(names | set(registry._REGISTRY))


class _MethodNames:
    """The ``choices`` of a method argument: listed in the help (read when the help is shown),
    while the check of a name is nshot's own (one error line that names a close method;
    :func:`_method`), so that a method registered by a third-party package is accepted."""

    def __contains__(self, name: object) -> bool:
        return True

    def __iter__(self):
        return iter(method_names())


def _add_method(p: argparse.ArgumentParser, extra: str = "", **kwargs: Any) -> None:
    p.add_argument(
        "method",
        metavar="METHOD",
        choices=_MethodNames(),
        help="a registered method (`nshot list`): %(choices)s" + extra,
        **kwargs,
    )


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print machine-readable JSON on stdout (human output and progress go to stderr)",
    )


def _add_storage(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--storage", default=None, metavar="PATH_OR_URI", help=help)
    p.add_argument("--output", dest="storage", action=_Deprecated, current="--storage")


def _add_worker_resources(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpus-per-worker",
        type=float,
        default=None,
        help="GPUs each Ray Train worker asks for (default: the --scale preset's, else 0)",
    )
    p.add_argument(
        "--cpus-per-worker",
        type=float,
        default=None,
        help="CPUs each Ray Train worker asks for (default: the --scale preset's, else 1)",
    )
    p.add_argument(
        "--scale",
        default=None,
        help="a scaling preset: local | cpu2 | gpu1 | gpu8 | multinode (workers, GPUs and CPUs "
        "per worker; --workers and the two above override it)",
    )


def _add_allow_earlier(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-earlier-checkpoint",
        action="store_true",
        help="a run dir whose latest checkpoint is incomplete (no state.json): use (train "
        "--resume: continue from) the latest complete one instead of failing",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="nshot", description=" ".join(__doc__.split("\n\n")[0].split()).replace("``", "")
    )
    p.add_argument(
        "--version", action="version", version=f"nshot {_version()}", help="print the version"
    )
    sub = p.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="`nshot COMMAND --help` describes each",
    )

    s = sub.add_parser("list", help="list the registered methods")
    _add_json(s)
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("train", help="train a method with Ray Train")
    _add_method(s)
    _add_config_args(s)
    _add_storage(
        s,
        "where runs live: a local path or a URI (s3://bucket/runs, gs://...); default "
        "$NSHOT_STORAGE, else ~/.cache/nshot/runs. A worker group on several hosts needs a URI "
        "or a shared mount (NSHOT_STORAGE_SHARED=1)",
    )
    s.add_argument(
        "--name",
        default=None,
        help="run name, one path component: the run lives in <storage>/<name> "
        "(default <method>-<preset>)",
    )
    s.add_argument("--workers", type=int, default=None, help="Ray Train workers (0: in-process)")
    _add_worker_resources(s)
    s.add_argument(
        "--resume", action="store_true", help="continue the run from its latest checkpoint"
    )
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing nshot run of that name (a directory holding nshot_run.json)",
    )
    s.add_argument(
        "--max-failures", type=int, default=0, help="worker-group restarts allowed (>= 0)"
    )
    _add_allow_earlier(s)
    s.add_argument(
        "--verbose",
        action="store_true",
        help="also show Ray Train's own INFO lines (reports, checkpoints, worker group set-up)",
    )
    _add_json(s)
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("eval", help="evaluate a checkpoint with the paper's metrics")
    _add_method(s)
    s.add_argument("--checkpoint", required=True, help="checkpoint dir or run dir (latest)")
    _add_allow_earlier(s)
    s.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an evaluation field (the method's EVAL_FIELDS, e.g. tail's eval_episodes); "
        "a field that shapes the model is fixed by the checkpoint",
    )
    _add_json(s)
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("tune", help="sweep a method's config with Ray Tune")
    _add_method(s)
    _add_config_args(s)
    s.add_argument(
        "--search", default="random", help="random | optuna | ax | auxbo (or a method's searcher)"
    )
    s.add_argument("--num-samples", type=int, default=10, help="trials in the sweep")
    s.add_argument("--max-concurrent", type=int, default=2, help="trials running at once")
    s.add_argument(
        "--scheduler",
        default=None,
        choices=SCHEDULERS,
        help="asha (early stopping on f) or none (every trial runs to the end; fifo is the "
        "same); default none",
    )
    s.add_argument(
        "--space",
        default=None,
        help="search space as JSON (or @file.json), overriding the method's declared one: "
        '{"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": true}, ...}',
    )
    s.add_argument(
        "--search-option",
        dest="search_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="searcher option (repeatable), e.g. auxbo: checkpoint=DIR, fallback=gp, "
        "surrogate=false (the GP alone), n_init=2",
    )
    s.add_argument("--seed", type=int, default=None, help="searcher seed (default: config seed)")
    s.add_argument(
        "--workers", type=int, default=None, help="Ray Train workers per trial (0: in-process)"
    )
    _add_worker_resources(s)
    _add_storage(s, "where sweeps live: a local path or a URI (default $NSHOT_STORAGE/tune)")
    s.add_argument("--name", default=None, help="sweep name (default <method>-<preset>-<search>)")
    s.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    s.add_argument(
        "--history", default=None, help="history directory (default $NSHOT_CACHE/history)"
    )
    s.add_argument("--no-history", action="store_true", help="do not save the sweep to the history")
    s.add_argument(
        "--no-reuse-actors",
        action="store_true",
        help="start every in-process trial in a new process (default: the next trial reuses a "
        "finished trial's process, with the same results and no start-up per trial)",
    )
    s.add_argument(
        "--verbose",
        action="store_true",
        help="show Tune's own status tables instead of nshot's line per finished trial",
    )
    _add_json(s)
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("history", help="list the sweeps saved in the history")
    s.add_argument("--method", default=None, help="only the sweeps of this method")
    s.add_argument(
        "--history", default=None, help="history directory (default $NSHOT_CACHE/history)"
    )
    _add_json(s)
    s.set_defaults(func=cmd_history)

    s = sub.add_parser("reproduce", help="run the paper's comparison; write results.{json,md,png}")
    _add_method(s, nargs="?", default=None, extra="; not with --all")
    _add_config_args(s)
    s.add_argument(
        "--out",
        default=None,
        help="results folder (default results/<method>-<preset>; with --all: DIR/<method>/, "
        "default each method's committed methods/<method>/results/)",
    )
    s.add_argument(
        "--all",
        action="store_true",
        help="every registered method, one after another (one Ray task each when RAY_ADDRESS "
        "names a cluster), skipping those whose results are fresh; then the report",
    )
    s.add_argument("--only", default=None, metavar="A,B", help="with --all: only these methods")
    s.add_argument(
        "--force", action="store_true", help="with --all: re-make results that are fresh"
    )
    s.add_argument(
        "--in-process",
        action="store_true",
        help="run the comparison's jobs one after another in this process, without Ray "
        "(for a debugger or a profiler; same results, slower); NSHOT_IN_PROCESS=1 does the same",
    )
    s.add_argument(
        "--scale",
        default=None,
        help="a scaling preset (local | cpu2 | gpu1 | gpu8 | multinode): every job that trains a "
        "network asks for its CPUs and GPUs per worker (default: each job's own request)",
    )
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan as JSON (every job with its CPUs, GPUs and threads) and run nothing",
    )
    _add_json(s)
    s.set_defaults(func=cmd_reproduce)

    s = sub.add_parser(
        "claims", help="evaluate a method's paper claims on an existing results.json (no rerun)"
    )
    s.add_argument(
        "results",
        help="a results.json written by nshot reproduce, or a method's name: its committed "
        "results of --preset (methods/<method>/results/<preset>.json)",
    )
    s.add_argument(
        "--preset",
        default="small",
        help="with a method's name: which committed results (default small)",
    )
    s.add_argument(
        "--write",
        action="store_true",
        help="write the claims into that results.json and its results.md",
    )
    _add_json(s)
    s.set_defaults(func=cmd_claims)

    s = sub.add_parser(
        "report", help="one reproducibility report (HTML + Markdown) over every method's results"
    )
    s.add_argument(
        "--out",
        default=None,
        help="folder of index.html and report.md (default: the checkout's docs/report for the "
        "committed results, else ./nshot-report)",
    )
    s.add_argument("--preset", default="small", help="which committed results (default small)")
    s.add_argument(
        "--results",
        nargs="+",
        default=None,
        metavar="DIR",
        help="fresh `nshot reproduce --out DIR` folders instead of the committed results",
    )
    s.add_argument(
        "--readme", default=None, help="also regenerate the method table of this README.md"
    )
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("bench", help="benchmarks that write JSON ratios")
    s.add_argument(
        "what",
        metavar="WHAT",
        help="train, serve, serve-sustained, serve-ramp, deepspeed, or a method with its own "
        "benchmark (e.g. tail)",
    )
    s.add_argument(
        "--method", default="tail", help="train, serve, serve-sustained, serve-ramp: the method"
    )
    s.add_argument(
        "--preset", default="small", help="train and a method's own benchmark: the preset"
    )
    s.add_argument("--steps", type=int, default=60, help="train: steps per run")
    s.add_argument("--workers", type=int, default=2, help="deepspeed: Ray Train workers")
    s.add_argument(
        "--shape", default="smollm2", choices=["smollm2", "tiny"], help="deepspeed: model shape"
    )
    s.add_argument(
        "--requests",
        type=int,
        default=None,
        help="serve: requests per run (default 200, at least 2 per client); "
        "serve-sustained: requests in all (default 10000)",
    )
    s.add_argument("--clients", type=int, default=64, help="serve-sustained: concurrent clients")
    s.add_argument(
        "--replicas", default="1,2", help="serve: also a block with the batched app on N replicas"
    )
    s.add_argument("--repeats", type=int, default=3, help="serve: runs per level and system")
    s.add_argument("--levels", default="1,8,32,128", help="serve: concurrent clients per level")
    s.add_argument(
        "--ingress",
        default="proxy,direct,throughput,haproxy",
        help="serve: ingress modes, one block each (each with the batched and unbatched apps)",
    )
    s.add_argument(
        "--batch-wait-ms",
        dest="bench_batch_wait_ms",
        default=None,
        help="serve: how long the batched apps wait for a batch to fill (default: the serving "
        "default); each further comma-separated value adds an app serve_batched_w<ms> (in "
        "place of the unbatched app, outside the proxy block)",
    )
    s.add_argument("--autoscale", default="1:2", help="serve-ramp: MIN:MAX replicas")
    s.add_argument(
        "--phases",
        default="1x20,64x90,1x30",
        help="serve-ramp: CLIENTSxSECONDS load phases, in order",
    )
    s.add_argument("--checkpoint", default=None, help="serve: checkpoint (default: train smoke)")
    s.add_argument("--out", default=None, help="the JSON file to write (results)")
    _add_json(s)
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser(
        "serve",
        help="serve a checkpoint (or every run of a folder: --all) over HTTP with Ray Serve",
    )
    _add_method(s, nargs="?", default=None, extra="; not with --all")
    s.add_argument("--checkpoint", default=None, help="checkpoint dir or run dir (latest)")
    s.add_argument(
        "--all",
        default=None,
        metavar="RUNS_DIR",
        help="serve the newest checkpoint of every method among the runs in RUNS_DIR (e.g. "
        "~/.cache/nshot/runs) under one Serve instance and one port, one application per "
        "method at /<method>",
    )
    s.add_argument(
        "--write-config",
        default=None,
        metavar="FILE",
        help="with --all: write the Ray Serve config of that deployment to FILE (YAML; one "
        "application per method, edit it for a token or options per application; deploy it "
        "with `serve run FILE`) and serve nothing",
    )
    _add_allow_earlier(s)
    s.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    s.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    s.add_argument("--replicas", type=int, default=1, help="replicas per application (default 1)")
    s.add_argument(
        "--autoscale",
        default=None,
        metavar="MIN:MAX",
        help="Serve autoscaling between MIN and MAX replicas on ongoing requests "
        "(instead of --replicas)",
    )
    s.add_argument(
        "--replica-cpus",
        type=float,
        default=None,
        metavar="CPUS",
        help="CPUs each replica asks Ray for (> 0; fractions share a core). Default: 1, or "
        "min(1, 0.9 x the cluster's CPUs / replicas) when the replicas of every application "
        "(x MAX under --autoscale) would not fit at 1 each (the cluster: the running Ray, or "
        "this machine for --write-config). A request that does not fit is refused",
    )
    s.add_argument(
        "--replica-gpus",
        type=float,
        default=0.0,
        metavar="GPUS",
        help="GPUs each replica asks Ray for (default 0; a fraction shares one GPU, above 1 "
        "whole GPUs); refused when the cluster has no GPU or too few for every replica",
    )
    s.add_argument(
        "--ingress",
        choices=["proxy", "direct", "throughput", "haproxy"],
        default=None,
        help="how requests reach the replica: the replica's own HTTP server on --port (direct, "
        "the default when nshot starts Ray; throughput: Serve's throughput-optimised mode), "
        "Serve's proxy actor (proxy; on a running Ray the default is the mode it was started "
        "with), or HAProxy (binds every interface: needs --token); set before Ray starts "
        "(README: Serve under load)",
    )
    s.add_argument(
        "--drain-s",
        type=float,
        default=None,
        metavar="S",
        help="under direct ingress, how long a replica that leaves (Ctrl-C, a scale-down) keeps "
        "answering so that a load balancer in front stops sending to it (default 2; Serve's own "
        "is 30; requests in flight are always answered); set before Ray starts",
    )
    s.add_argument(
        "--max-ongoing",
        type=int,
        default=128,
        help="requests a replica takes at once (they queue inside it for the batcher)",
    )
    s.add_argument(
        "--max-queued",
        type=int,
        default=128,
        help="requests the proxy holds beyond that; past it: 503 with Retry-After",
    )
    s.add_argument(
        "--max-batch-size", type=int, default=16, help="requests one batch holds (default 16)"
    )
    s.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="how long a batch's first request waits for more (default 0: a batch is what "
        "queued while the previous one ran)",
    )
    s.add_argument(
        "--token", default=None, help="require this bearer token (default $NSHOT_SERVE_TOKEN)"
    )
    s.add_argument(
        "--conformal",
        choices=["caos"],
        default=None,
        help="also return prediction sets (CAOS over the support set) from a few-shot classifier",
    )
    s.add_argument("--alpha", type=float, default=0.1, help="--conformal: miscoverage level")
    s.add_argument(
        "--conformal-k", type=int, default=1, help="--conformal: smallest one-shot scores summed"
    )
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser(
        "cluster",
        help="a local multi-node Ray cluster on this machine: start | stop | status | env",
        add_help=False,
    )
    # dispatched to nshot.cluster before parsing (see main)

    s = sub.add_parser("quickstart", help="train, evaluate and serve TAIL on an embedded local Ray")
    s.add_argument(
        "--out",
        default=os.environ.get("NSHOT_QUICKSTART_DIR", "nshot-quickstart"),
        help="results folder: the run and its checkpoint (default $NSHOT_QUICKSTART_DIR, else "
        "nshot-quickstart)",
    )
    s.add_argument(
        "--preset",
        default="quickstart",
        help="TAIL's preset (default quickstart: a 3-minute model)",
    )
    s.set_defaults(func=cmd_quickstart)

    s = sub.add_parser(
        "new",
        help="write a new method package (a working template to fill in; docs/adding-a-method.md)",
    )
    s.add_argument(
        "name",
        metavar="NAME",
        help="the method's name: a lowercase Python identifier, e.g. my_method",
    )
    s.add_argument(
        "--dir",
        default=None,
        help="the folder the package goes in, as DIR/<name>/ (default: ./methods when the "
        "current folder is an nshot checkout, else the current folder)",
    )
    s.set_defaults(func=cmd_new)
    for command in sub._choices_actions:  # `nshot COMMAND --help` opens with what it does
        if sub.choices[command.dest].description is None:
            sub.choices[command.dest].description = command.help
    return p


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = " ".join(str(message).split("\n"))
    print(f"nshot: warning: {text}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["cluster"]:  # its own options (and --help) belong to the cluster tool
        from nshot import cluster

        return cluster.main(argv[1:], prog="nshot cluster")
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # refused by the subcommand's parser: its usage, and a close option
        _subparser(parser, args.command).unrecognized(extras)
    # train: the command an interrupted run is resumed with, in the current spelling
    args.argv = _current_spelling(argv)
    with _plain_output():
        try:
            with warnings.catch_warnings():
                # nshot's own warnings (e.g. an earlier checkpoint taken) as one line each
                warnings.showwarning = _one_line_warning
                return int(args.func(args) or 0)
        except NshotError as err:
            text = " ".join(str(err).split("\n"))  # one line, whatever the message holds
            print(f"nshot: error: {text}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"nshot: interrupted: {args.command} stopped", file=sys.stderr)
            return 130


def _subparser(parser: argparse.ArgumentParser, command: str) -> _Parser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)  # pragma: no cover - the parser has its subcommands


def _current_spelling(argv: list[str]) -> list[str]:
    """``argv`` with a deprecated option spelled as it is now (``--output`` as ``--storage``)."""
    out = []
    for a in argv:
        flag, eq, value = a.partition("=")
        out.append(f"--storage{eq}{value}" if flag == "--output" else a)
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
