"""The Ray Train runner: one ``TorchTrainer`` for any method.

``fit(method, cfg, ...)`` starts an embedded local Ray when none is running (or connects to
``RAY_ADDRESS``), builds ``ScalingConfig``/``RunConfig``/``CheckpointConfig``/``FailureConfig``,
runs the method's ``train_loop`` on the workers (or in-process with ``workers=0``, Ray Train's
local mode) and returns where the final checkpoint is.

Runs live in ``<storage>/<name>``. The storage is a local directory or a URI that pyarrow opens
(``s3://``, ``gs://``, ``abfs://``, ``hdfs://``, ``file://``). On a cluster of several hosts a
worker group needs storage every node reaches: a local path is refused there (``NshotError``)
unless all nodes share one host (a local multi-node cluster) or ``NSHOT_STORAGE_SHARED=1`` says
the path is a shared mount (NFS, Lustre, ...). Re-running with the same storage and name and
``resume=True`` continues from the run's latest checkpoint (Ray Train V2 restores its
checkpoint manager from the run directory; local mode reads the latest nshot checkpoint).

Nothing outside ``<storage>/<name>`` is written or deleted: a run name is one path component
(:func:`check_run_name`), a local run directory that is a symbolic link is refused, and
``overwrite=True`` deletes only a directory that is an nshot run, one that holds the run marker
``nshot_run.json`` (:data:`RUN_MARKER`, written before training starts). Bad arguments (a name,
an empty or unwritable storage, a negative ``max_failures``) fail before Ray starts.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nshot.errors import ConfigError, NshotError
from nshot.fileio import atomic_write
from nshot.method import MethodConfig, get
from nshot.train.checkpoint import find_checkpoints

RUN_MARKER = "nshot_run.json"
RUN_FORMAT = "nshot-run/1"

SCALE_PRESETS: dict[str, dict[str, float]] = {
    # name: workers, gpus per worker, cpus per worker
    "local": {"workers": 0, "gpus_per_worker": 0, "cpus_per_worker": 1},
    "cpu2": {"workers": 2, "gpus_per_worker": 0, "cpus_per_worker": 1},
    "gpu1": {"workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 4},
    "gpu8": {"workers": 8, "gpus_per_worker": 1, "cpus_per_worker": 8},
    "multinode": {"workers": 16, "gpus_per_worker": 1, "cpus_per_worker": 8},
}


@dataclass
class Scaling:
    workers: int = 0
    gpus_per_worker: float = 0
    cpus_per_worker: float = 1

    @classmethod
    def preset(cls, name: str) -> Scaling:
        if name not in SCALE_PRESETS:
            raise ConfigError(
                f"--scale: unknown preset {name!r}; choose one of {sorted(SCALE_PRESETS)}"
            )
        return cls(**SCALE_PRESETS[name])  # type: ignore[arg-type]

    def validate(self) -> None:
        if self.workers < 0:
            raise ConfigError("--workers: must be >= 0 (0 runs in-process, Ray Train local mode)")
        if self.gpus_per_worker < 0 or self.cpus_per_worker <= 0:
            raise ConfigError("--gpus-per-worker must be >= 0 and --cpus-per-worker > 0")
        if self.workers == 0 and self.gpus_per_worker > 0:
            raise ConfigError("--gpus-per-worker needs --workers >= 1")


@dataclass
class TrainResult:
    run_dir: Path | str  # a str URI when the storage is remote (s3://...)
    checkpoint: Path | str | None
    metrics: dict[str, Any]
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    ray_logs: Path | None = None  # Ray's own log lines of the run, copied into the run folder


def is_uri(path: str | os.PathLike) -> bool:
    """``s3://bucket/x``, ``gs://...``, ``file:///...``: a storage URI (pyarrow opens it)."""
    text = str(path)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum()


def is_local_storage(path: str | os.PathLike) -> bool:
    """A path on this machine's file system (a plain path or a ``file://`` URI)."""
    return not is_uri(path) or str(path).startswith("file://")


def resolve_storage(storage: str | os.PathLike | None) -> Path | str:
    """``storage`` (or ``$NSHOT_STORAGE``, or the cache) as an absolute local ``Path``, or the
    URI itself (a ``str``, without a trailing slash) for remote storage."""
    if storage is None:
        return default_storage()
    if is_uri(storage):
        return str(storage).rstrip("/")
    return Path(storage).expanduser().resolve()


def default_storage() -> Path | str:
    env = os.environ.get("NSHOT_STORAGE")
    if env:
        return env.rstrip("/") if is_uri(env) else Path(env).expanduser().resolve()
    from nshot.data import cache_dir

    return cache_dir() / "runs"


def check_storage_reachable(storage: Path | str, nodes: list[dict[str, Any]] | None = None) -> None:
    """Refuse a local storage path for a worker group on a cluster of several hosts.

    Every worker writes its checkpoint shards to the storage path, so the path must be one that
    every node reaches: a URI (``s3://``, ``gs://``, ...), a local path when all alive nodes run
    on the same host (a local multi-node cluster: the path is the same directory for all), or a
    shared mount declared with ``NSHOT_STORAGE_SHARED=1``. ``nodes`` defaults to ``ray.nodes()``.
    """
    if not is_local_storage(storage):
        return
    if os.environ.get("NSHOT_STORAGE_SHARED", "").lower() in ("1", "true", "yes"):
        return
    if nodes is None:
        import ray

        nodes = ray.nodes()
    alive = [n for n in nodes if n.get("Alive", n.get("alive", True))]
    hosts = {n.get("NodeManagerAddress") or n.get("node_ip") for n in alive}
    if len(alive) <= 1 or len(hosts) <= 1:
        return
    raise NshotError(
        f"--storage {storage} is a local path, but the cluster has {len(alive)} nodes on "
        f"{len(hosts)} hosts: workers on other hosts would write their checkpoints where the "
        "driver cannot read them. Use storage every node reaches: --storage s3://bucket/runs "
        "(or gs://..., or another pyarrow URI; or set NSHOT_STORAGE), or a shared mount (NFS) "
        "marked with NSHOT_STORAGE_SHARED=1"
    )


def check_run_name(name: Any, what: str = "--name") -> str:
    """``name`` if it is one path component, else :class:`ConfigError`.

    A run (or sweep) lives in ``<storage>/<name>``: a name with a ``/`` or ``\\``, ``.``,
    ``..``, an empty name or one with a NUL byte would put it (and what ``--overwrite``
    deletes) somewhere else.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{what} {name!r}: a run name must not be empty")
    bad = [c for c in ("/", "\\", "\0") if c in name]
    if bad or name in (".", ".."):
        raise ConfigError(
            f"{what} {name!r}: a run name is one path component inside the storage "
            "(no '/', no '\\', not '.' or '..', no NUL byte); choose where runs live with --storage"
        )
    return name


def check_storage_arg(storage: str | os.PathLike | None) -> None:
    """An empty ``storage`` is refused (it would resolve to the current directory)."""
    if storage is not None and not str(storage).strip():
        raise ConfigError(
            "--storage is empty: give a directory or a URI (s3://bucket/runs), or leave it out "
            "for $NSHOT_STORAGE, else ~/.cache/nshot/runs"
        )


def prepare_local_storage(storage: Path) -> None:
    """Create the local storage directory and check that nshot can write in it (before Ray
    starts): a path under a file, in ``/proc`` or without write permission fails here with
    one clear :class:`NshotError`."""
    try:
        storage.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".nshot-write-check-", dir=storage)
        os.rmdir(probe)
    except OSError as err:
        reason = err.strerror or str(err)
        raise NshotError(
            f"--storage {storage}: cannot be a writable directory ({reason}); choose a "
            "directory you can write to"
        ) from None


def is_run_marker(path: Path) -> bool:
    """``path`` is nshot's run marker: a plain file (not a link) holding a JSON object with the
    run's ``method``."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("method"), str)


class _RunDir:
    """The run directory ``<storage>/<name>``, on the local disk or behind a pyarrow URI."""

    def __init__(self, storage: Path | str, name: str):
        check_run_name(name)
        self.local = isinstance(storage, Path)
        if self.local:
            self.path: Path | str = storage / name
            self._fs = None
            self._check_local(storage)
        else:
            from pyarrow import fs as pafs

            self.path = f"{storage}/{name}"
            self._fs, self._fs_path = pafs.FileSystem.from_uri(self.path)

    def _check_local(self, storage: Path) -> None:
        """The run directory is ``storage/name`` itself: not a link, not a file."""
        p = Path(self.path)
        if p.is_symlink():
            raise NshotError(
                f"run directory {p} is a symbolic link (to {os.readlink(p)}): nshot writes and "
                "deletes runs only inside the storage; remove the link or choose another --name"
            )
        if p.exists() and not p.is_dir():
            raise NshotError(f"run directory {p} exists and is not a directory")
        if not p.resolve().is_relative_to(storage.resolve()):  # pragma: no cover - defence
            raise NshotError(f"run directory {p} resolves outside the storage {storage}")

    def has_files(self) -> bool:
        if self.local:
            p = Path(self.path)
            return p.is_dir() and any(p.iterdir())
        from pyarrow import fs as pafs

        sel = pafs.FileSelector(self._fs_path, allow_not_found=True, recursive=False)
        return bool(self._fs.get_file_info(sel))

    def is_run(self) -> bool:
        """The directory holds nshot's run marker."""
        if self.local:
            return is_run_marker(Path(self.path) / RUN_MARKER)
        from pyarrow import fs as pafs

        marker = f"{self._fs_path}/{RUN_MARKER}"
        if self._fs.get_file_info(marker).type != pafs.FileType.File:
            return False
        try:
            with self._fs.open_input_stream(marker) as f:
                data = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and isinstance(data.get("method"), str)

    def clear(self) -> None:
        """Delete the run (only ever called on a directory that :meth:`is_run`)."""
        if self.local:
            shutil.rmtree(self.path)  # refuses a link; links inside are removed, not followed
        else:
            self._fs.delete_dir(self._fs_path)

    def write(self, name: str, text: str) -> None:
        if self.local:
            atomic_write(Path(self.path) / name, text)
            return
        self._fs.create_dir(self._fs_path, recursive=True)
        with self._fs.open_output_stream(f"{self._fs_path}/{name}") as f:
            f.write(text.encode())


def ensure_ray(**init_kwargs: Any) -> None:
    """Connect to ``RAY_ADDRESS`` when set, else start an embedded single-node Ray."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    # workers print their progress lines once (Ray's print patch would log them twice)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **init_kwargs)
        return
    # The dashboard process hosts the State API that Ray Train's placement-group cleaner
    # polls; it binds to loopback only.
    kwargs: dict[str, Any] = {"include_dashboard": True, "dashboard_host": "127.0.0.1"}
    kwargs.update(init_kwargs)
    with _loopback_only(), _own_gcs_address(kwargs):
        ray.init(**kwargs)
    _drop_benign_ray_lines()


@contextlib.contextmanager
def _own_gcs_address(kwargs: dict[str, Any]):
    """Give the embedded Ray's processes its own address (``RAY_ADDRESS``).

    Ray's State API, which Ray Train's placement-group cleaner polls from a worker process,
    finds "the" local cluster by looking for running GCS processes when ``RAY_ADDRESS`` is not
    set; on a machine running several Ray instances it fails ("Found multiple active Ray
    instances") and the cleaner dies with a traceback. The GCS port is chosen here (a free
    loopback port, ``RAY_GCS_SERVER_PORT`` while ``ray.init`` runs) and the job's runtime
    environment carries ``RAY_ADDRESS=127.0.0.1:<port>`` to every worker it starts (runtime
    environments merge ``env_vars`` into tasks' and actors' own)."""
    import socket

    from ray._private import ray_constants

    if os.environ.get(ray_constants.GCS_PORT_ENVIRONMENT_VARIABLE):
        yield  # the user chose the port
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(kwargs.get("runtime_env") or {})
    env["env_vars"] = {"RAY_ADDRESS": f"127.0.0.1:{port}", **(env.get("env_vars") or {})}
    kwargs["runtime_env"] = env
    os.environ[ray_constants.GCS_PORT_ENVIRONMENT_VARIABLE] = str(port)
    try:
        yield
    finally:
        os.environ.pop(ray_constants.GCS_PORT_ENVIRONMENT_VARIABLE, None)


# Lines Ray prints at ERROR level although nothing is wrong, so that nshot's terminal shows
# errors that are errors. Ray Train's controller starts its PreemptionWatcher actor with its
# arguments in the object store and restarts allowed, and Ray's core worker then logs that a
# restart "will fail" should those arguments be lost: every `nshot train` run printed it.
_BENIGN_RAY_LINES = (("Actor with class name: 'PreemptionWatcher'", "constructor arguments"),)


def _drop_benign_ray_lines() -> None:
    """Wrap Ray's printing of worker log lines so that the lines of ``_BENIGN_RAY_LINES`` are
    dropped (they stay in Ray's session logs); every other line is printed as Ray prints it.
    ``NSHOT_VERBOSE=1`` keeps them all."""
    if _env_verbose():
        return
    try:
        from ray._private import worker as ray_worker

        dispatcher = ray_worker.global_worker_stdstream_dispatcher
        handlers = dict(dispatcher.handlers)
        printer = handlers.get("ray_print_logs")
    except (ImportError, AttributeError):  # another Ray version: its lines stay
        return
    if printer is None or getattr(printer, "_nshot_filtered", False):
        return

    def filtered(data: dict[str, Any]) -> None:
        lines = [
            line
            for line in data.get("lines", [])
            if not any(all(part in line for part in parts) for parts in _BENIGN_RAY_LINES)
        ]
        if lines:
            printer({**data, "lines": lines})

    filtered._nshot_filtered = True  # type: ignore[attr-defined]
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", filtered)


@contextlib.contextmanager
def _loopback_only():
    """Start the embedded single-node Ray on 127.0.0.1 only.

    By default Ray binds its node to the host's address, and its metrics exporters (the
    dashboard's, the agent's, the autoscaler monitor's) listen on 0.0.0.0 without
    authentication. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's switch for a
    single-node cluster) the node address is the loopback address and those servers bind it.
    The processes ``ray.init`` starts inherit the variable; it is restored afterwards so that
    a multi-node cluster this process starts later (``ray start``) is not refused. A user who
    sets the variable decides for themselves.
    """
    from ray._private import ray_constants

    if ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR in os.environ:
        yield
        return
    saved = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
        ray_constants.ENABLE_RAY_CLUSTER = saved


def run_loop(
    method_name: str,
    config: dict[str, Any],
    *,
    local_dir: str | None = None,
    tune: dict[str, Any] | None = None,
    in_tune: bool = False,
) -> None:
    """Run ``method_name``'s train loop in this process with the session set up: the config
    validated, torch's threads set, :class:`~nshot.train.session.RunInfo` installed.

    It is what every Ray Train worker runs (through :func:`build_trainer`), what Ray Train's
    local mode runs in-process (``local_dir``: where checkpoints go), and what an in-process
    Tune trial runs (``tune``: the trial's objective and curve, ``in_tune=True``)."""
    import torch

    from nshot.train.session import RunInfo, install_run

    method = get(method_name)
    cfg = method.config_from_dict(config)
    torch.set_num_threads(cfg.torch_threads)
    install_run(
        RunInfo(
            method=method.name,
            method_version=method.version,
            config=cfg.model_dump(),
            local_dir=local_dir,
            tune=tune,
            in_tune=in_tune,
        )
    )
    method.train_loop(cfg)


def _route_info_to_file(loggers: list, log_dir: str | None) -> None:
    """Send the INFO lines of ``loggers`` to ``<log_dir>/<this process>.log`` and only their
    warnings and errors to the terminal (stderr). Without a writable ``log_dir`` the INFO lines
    are dropped (they were never more than Ray's bookkeeping)."""
    import logging

    handler: logging.Handler | None = None
    if log_dir:
        try:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(Path(log_dir) / f"train-pid{os.getpid()}.log")
            handler.setLevel(logging.INFO)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s -- %(message)s")
            )
        except OSError:
            handler = None
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s -- %(message)s"))
    for lg in loggers:
        for old in getattr(lg, "_nshot_handlers", ()):  # an earlier run in this process
            lg.removeHandler(old)
            old.close()
        lg.setLevel(logging.INFO if handler else logging.WARNING)
        lg.propagate = False
        lg._nshot_handlers = [console] + ([handler] if handler else [])
        for h in lg._nshot_handlers:
            lg.addHandler(h)


def _quiet_storage_tracebacks() -> None:
    """Keep a storage error's traceback, which Ray Train logs on the worker ("Error in training
    function"), off the terminal: the driver tells the error in one line (``nshot train
    --verbose`` prints the traceback too). Log files keep it."""
    import logging

    class NoStorageTraceback(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            text = record.getMessage()
            return not ("Error in training function" in text and "CheckpointWriteError" in text)

    for handler in logging.getLogger("ray.train").handlers:
        if not isinstance(handler, logging.StreamHandler) or isinstance(
            handler, logging.FileHandler
        ):
            continue
        if not any(type(f).__name__ == "NoStorageTraceback" for f in handler.filters):
            handler.addFilter(NoStorageTraceback())


def _worker_entry(loop_config: dict[str, Any]) -> None:
    """Runs on every Ray Train worker (or in-process in local mode)."""
    import logging

    # Ray Train logs every report and every persisted checkpoint at INFO; nshot prints its own
    # progress line, and Ray Train's lines go to the run folder (ray_logs/<process>.log)
    if not loop_config.get("verbose"):
        loggers = [logging.getLogger("ray.train")]
        try:  # its per-report line is logged under the module's file name, not "ray.train..."
            from ray.train.v2._internal.execution import context as train_context

            loggers.append(train_context.logger)
        except (ImportError, AttributeError):  # another Ray version: its lines stay
            pass
        _route_info_to_file(loggers, loop_config.get("log_dir"))
        _quiet_storage_tracebacks()
    if loop_config.get("local_dir") is None:  # a worker group: say where each rank runs
        import ray
        import ray.train

        ctx = ray.train.get_context()
        rt = ray.get_runtime_context()
        print(
            f"[nshot {loop_config['method']}] rank {ctx.get_world_rank()}/"
            f"{ctx.get_world_size()} on node {rt.get_node_id()}",
            file=sys.stderr,
            flush=True,
        )
    run_loop(loop_config["method"], loop_config["config"], local_dir=loop_config.get("local_dir"))


def _env_verbose() -> bool:
    return os.environ.get("NSHOT_VERBOSE", "").lower() in ("1", "true", "yes")


def build_trainer(
    method_name: str,
    cfg: MethodConfig,
    scaling: Scaling,
    *,
    name: str,
    storage_path: str,
    local_dir: str | None = None,
    keep_checkpoints: int | None = None,
    max_failures: int = 0,
    callbacks: list[Any] | None = None,
    verbose: bool = False,
):
    """The ``TorchTrainer`` that runs ``method_name``'s loop with ``cfg`` under ``scaling``
    (``scaling.workers == 0``: Ray Train's local mode, checkpoints written to ``local_dir``),
    its run stored in ``<storage_path>/<name>``. ``nshot train`` and every multi-worker Tune
    trial build their trainers here.

    Ray Train's own INFO lines (every report, every checkpoint persisted, the worker group's
    set-up) go to Ray's session log files only, so the terminal shows nshot's progress lines;
    ``verbose`` (``NSHOT_VERBOSE=1``, ``nshot train --verbose``) shows them too. Warnings and
    errors always reach the terminal."""
    import ray.train
    from ray.train.torch import TorchTrainer

    verbose = verbose or _env_verbose()
    loop_config: dict[str, Any] = {
        "method": method_name,
        "config": cfg.model_dump(),
        "verbose": verbose,
    }
    if not is_uri(storage_path):  # Ray Train's INFO lines of each process go to the run folder
        loop_config["log_dir"] = str(Path(storage_path) / name / "ray_logs")
    if scaling.workers == 0:
        loop_config["local_dir"] = local_dir
        scaling_config = ray.train.ScalingConfig(num_workers=0)
    else:
        resources = {"CPU": scaling.cpus_per_worker}
        if scaling.gpus_per_worker:
            resources["GPU"] = scaling.gpus_per_worker
        scaling_config = ray.train.ScalingConfig(
            num_workers=scaling.workers,
            use_gpu=scaling.gpus_per_worker > 0,
            resources_per_worker=resources,
        )
    run_config = ray.train.RunConfig(
        name=name,
        storage_path=storage_path,
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=keep_checkpoints),
        failure_config=ray.train.FailureConfig(max_failures=max_failures),
        callbacks=callbacks,
        logging_config=ray.train.LoggingConfig(log_level="INFO" if verbose else "WARNING"),
        # workers on other nodes do not inherit the driver's environment: one progress line each
        # (and a test's checkpoint fault, nshot.train.checkpoint.FAULT_ENV, when one is set)
        worker_runtime_env={"env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", **_test_fault_env()}},
    )
    return TorchTrainer(
        _worker_entry,
        train_loop_config=loop_config,
        scaling_config=scaling_config,
        run_config=run_config,
    )


def fit_trainer(trainer: Any) -> Any:
    """``trainer.fit()``, then hand back the run's controller actor at once.

    Ray Train registers a SIGINT handler (so Ctrl-C aborts the run) that holds the run's
    controller actor and stays installed after ``fit`` returns: the finished controller lives on
    until the next run replaces the handler, and then shuts down gracefully (up to 30 s) while
    the next run's controller starts. On a 2-CPU node that overlap has left the next run's
    driver waiting forever for its new controller (the controller was created; the driver never
    heard that it was alive). So, on the main thread, the handler that was there before ``fit``
    comes back and the finished controller is killed (its result is already in hand). Every
    nshot call of a Ray Train ``fit`` goes through here."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    try:
        return trainer.fit()
    finally:
        if main and before is not None:
            handler = signal.getsignal(signal.SIGINT)
            if handler is not before:
                signal.signal(signal.SIGINT, before)
                _kill_finished_controllers(handler)


def _kill_finished_controllers(handler: Any) -> None:
    """Kill the actors a replaced SIGINT handler held (Ray Train's holds its run's controller)."""
    import ray

    for cell in getattr(handler, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, ray.actor.ActorHandle):
            with contextlib.suppress(Exception):
                ray.kill(value, no_restart=True)


def fit(
    method_name: str,
    cfg: MethodConfig,
    *,
    scaling: Scaling | None = None,
    storage: str | os.PathLike | None = None,
    name: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    max_failures: int = 0,
    keep_checkpoints: int = 2,
    allow_earlier: bool = False,
    verbose: bool = False,
) -> TrainResult:
    """Train ``method_name`` with ``cfg`` through Ray Train and return the final checkpoint.

    Every argument is checked before Ray starts (:class:`ConfigError`/:class:`NshotError`):
    ``name`` is one path component, ``storage`` is not empty and, when local, a directory nshot
    can write in, ``max_failures >= 0``; ``overwrite`` replaces only an nshot run. ``resume``
    refuses a run whose newest checkpoint has lost its ``state.json`` unless ``allow_earlier``
    (in-process runs only) lets it continue from the newest complete one.

    A storage error while the run writes (no space, permission denied, a read-only file
    system, a vanished directory; from the train loop's checkpoint writer, in-process or on a
    worker) ends it with one :class:`~nshot.train.storage_errors.CheckpointStorageError`
    naming the path, what happened, the newest complete checkpoint and the ``nshot train ...
    --resume`` command (:func:`train_command`) that continues once the storage is fixed.
    """
    method = get(method_name)
    if not isinstance(cfg, method.Config):
        raise ConfigError(f"config for {method_name!r} must be a {method.Config.__name__}")
    name = check_run_name(f"{method_name}-{cfg.preset}" if name is None else name)
    if not isinstance(max_failures, numbers.Integral) or max_failures < 0:
        raise ConfigError(f"--max-failures {max_failures!r}: must be an integer >= 0")
    if resume and overwrite:
        raise ConfigError("--resume continues a run and --overwrite replaces it: pass one of them")
    check_storage_arg(storage)
    scaling = scaling or Scaling()
    scaling.validate()
    local = scaling.workers == 0
    storage_path = resolve_storage(storage)
    if local and not is_local_storage(storage_path):
        raise NshotError(
            f"--storage {storage_path}: --workers 0 (in-process) writes checkpoints to a local "
            "directory; use --workers >= 1 with a URI, or a local path"
        )
    if isinstance(storage_path, str):  # file:// URI: a local directory after all
        from urllib.parse import urlparse

        if storage_path.startswith("file://"):
            storage_path = Path(urlparse(storage_path).path).resolve()
    if isinstance(storage_path, Path):
        prepare_local_storage(storage_path)
    run = _RunDir(storage_path, name)
    run_dir = run.path
    exists = run.has_files()
    if exists and not (overwrite or resume):
        raise NshotError(
            f"run directory {run_dir} already exists: pass --resume to continue it, "
            "--overwrite to replace it, or --name for a new run"
        )
    if not exists and resume:
        raise NshotError(f"--resume: no run to resume at {run_dir}")
    if exists and overwrite and not run.is_run():
        raise NshotError(
            f"--overwrite: {run_dir} is not an nshot run (it has no {RUN_MARKER} marker), so "
            "nshot does not delete it; choose another --name (or --storage)"
        )
    if exists and resume and run.local:
        _check_resumable(Path(run_dir), local=local, allow_earlier=allow_earlier)

    ensure_ray()
    if not local:
        check_storage_reachable(storage_path)
    if exists and overwrite:
        run.clear()
    # a storage error (full, read-only, gone) ends the run as one StorageError line
    told = _StorageErrorsTold(method_name, cfg, scaling, storage_path, name, run_dir, max_failures)
    # the marker goes in before any training starts: this directory is an nshot run
    with told:
        run.write(
            RUN_MARKER,
            _json(
                {
                    "format": RUN_FORMAT,
                    "method": method_name,
                    "config": cfg.model_dump(),
                    "scaling": scaling.__dict__,
                    # where Ray keeps its own logs of this run (the driver's node), which the
                    # terminal does not show unless --verbose
                    "ray_logs": ray_logs_dir(),
                }
            ),
        )

    trainer = build_trainer(
        method_name,
        cfg,
        scaling,
        name=name,
        storage_path=str(storage_path),
        local_dir=str(run_dir) if local else None,
        keep_checkpoints=keep_checkpoints,
        max_failures=max_failures,
        verbose=verbose,
    )
    t0 = time.time()
    copied = None
    try:
        with told:
            result = fit_trainer(trainer)
    finally:
        if run.local:
            logs = Path(run_dir) / "ray_logs"
            copy_ray_logs(logs, since=t0)
            copied = logs if logs.is_dir() and any(logs.iterdir()) else None
    wall = time.time() - t0
    ckpt = _final_checkpoint(result, run_dir) if run.local else _final_uri(result, str(run_dir))
    if local:
        _prune_local(run_dir, keep_checkpoints)
        ckpt = find_checkpoints(run_dir)[-1] if find_checkpoints(run_dir) else None
    return TrainResult(
        run_dir=run_dir,
        checkpoint=ckpt,
        metrics=dict(result.metrics or {}),
        wall_s=wall,
        ray_logs=copied,
    )


# Ray's log files a run's folder keeps: the processes' stdout/stderr (where Ray Train's and
# Serve's INFO lines, and every worker's prints, go) and the Train controller's own log
_RAY_LOG_PATTERNS = ("worker-*.out", "worker-*.err", "*controller*.log", "*controller*.err")
_RAY_LOG_FILE_CAP = 4 << 20  # the tail of a longer file
_RAY_LOG_TOTAL_CAP = 32 << 20


def copy_ray_logs(dest: Path, *, since: float) -> Path | None:
    """Copy the Ray log files written since ``since`` (on this node) into ``dest``.

    The terminal shows nshot's own lines; Ray's lines of the run stay readable in the run's
    folder (``<storage>/<run>/ray_logs/``). Only files of the Ray session this process is
    connected to, modified since the run started, are copied: the tail of each (at most 4 MiB)
    and at most 32 MiB in all, newest first. Returns ``dest``, or None when there was nothing to
    copy (no Ray on this node, a remote cluster's logs, an empty session). Never raises: a run's
    result does not depend on its logs."""
    logs = ray_logs_dir()
    if logs is None or not Path(logs).is_dir():
        return None
    try:
        found: dict[Path, os.stat_result] = {}
        for pattern in _RAY_LOG_PATTERNS:
            for path in Path(logs).glob(pattern):
                st = path.stat()
                if path.is_file() and st.st_size > 0 and st.st_mtime >= since - 1:
                    found[path] = st
        if not found:
            return None
        dest.mkdir(parents=True, exist_ok=True)
        total = 0
        for path, st in sorted(found.items(), key=lambda kv: -kv[1].st_mtime):
            size = min(st.st_size, _RAY_LOG_FILE_CAP)
            if total + size > _RAY_LOG_TOTAL_CAP:
                break
            with open(path, "rb") as fh:
                if st.st_size > size:
                    fh.seek(st.st_size - size)
                data = fh.read(size)
            (dest / path.name).write_bytes(data)
            total += len(data)
        return dest
    except OSError:
        return None


def ray_logs_dir() -> str | None:
    """The log folder of the Ray session this process is connected to (on this node)."""
    try:
        import ray

        node = ray._private.worker._global_node
        return None if node is None else str(node.get_logs_dir_path())
    except (ImportError, AttributeError):
        return None


def _test_fault_env() -> dict[str, str]:
    """The test-only checkpoint fault (:data:`nshot.train.checkpoint.FAULT_ENV`) for the
    workers, when the driver has one; else nothing."""
    from nshot.train.checkpoint import FAULT_ENV

    return {FAULT_ENV: os.environ[FAULT_ENV]} if os.environ.get(FAULT_ENV) else {}


def train_command(
    method_name: str,
    cfg: MethodConfig,
    scaling: Scaling,
    storage: Path | str,
    name: str,
    *,
    max_failures: int = 0,
    resume: bool = True,
) -> list[str]:
    """The ``nshot train`` command line that trains ``cfg`` (its preset, and ``--set`` for
    every field that differs from it) under ``scaling`` in ``<storage>/<name>``; with
    ``--resume`` when ``resume``."""
    argv = ["nshot", "train", method_name, "--preset", cfg.preset]
    try:
        base = type(cfg).from_preset(cfg.preset).model_dump()
    except ConfigError:
        base = {}
    for key, value in cfg.model_dump().items():
        if key != "preset" and (key not in base or base[key] != value):
            argv += ["--set", f"{key}={_cli_value(value)}"]
    if scaling.workers:
        argv += ["--workers", str(scaling.workers)]
    if scaling.gpus_per_worker:
        argv += ["--gpus-per-worker", f"{scaling.gpus_per_worker:g}"]
    if scaling.cpus_per_worker != 1:
        argv += ["--cpus-per-worker", f"{scaling.cpus_per_worker:g}"]
    if max_failures:
        argv += ["--max-failures", str(max_failures)]
    argv += ["--storage", str(storage), "--name", name]
    return [*argv, "--resume"] if resume else argv


def _cli_value(value: Any) -> str:
    """``value`` as ``--set KEY=VALUE`` reads it back (JSON where a plain string would not)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, default=str)


class _StorageErrorsTold:
    """``with`` block: a storage error raised inside (:func:`~nshot.train.storage_errors.
    find_storage_fault`, also out of a Ray Train worker group's failure) becomes one
    :class:`~nshot.train.storage_errors.CheckpointStorageError`; anything else passes."""

    def __init__(self, method_name, cfg, scaling, storage, name, run_dir, max_failures):
        self.method_name, self.cfg, self.scaling = method_name, cfg, scaling
        self.storage, self.name, self.run_dir = storage, name, run_dir
        self.max_failures = max_failures

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> bool:
        if err is None or not isinstance(err, Exception):
            return False
        from nshot.train.storage_errors import (
            CheckpointStorageError,
            find_storage_fault,
            newest_complete_checkpoint,
        )

        fault = find_storage_fault(err, self.run_dir)
        if fault is None:
            return False
        local = isinstance(self.run_dir, Path)
        try:  # continue a run that has anything in it; start one again that lost its folder
            resume = not local or (self.run_dir.is_dir() and any(self.run_dir.iterdir()))
        except OSError:
            resume = False
        command = train_command(
            self.method_name,
            self.cfg,
            self.scaling,
            self.storage,
            self.name,
            max_failures=self.max_failures,
            resume=resume,
        )
        raise CheckpointStorageError(
            fault,
            storage=self.storage,
            run_dir=self.run_dir,
            newest=newest_complete_checkpoint(self.run_dir),
            command=command,
            resume=resume,
        ) from err


def _check_resumable(run_dir: Path, *, local: bool, allow_earlier: bool) -> None:
    """Before a resume: the checkpoint it would continue from is complete, or the user chose
    the newest complete one (``allow_earlier``, in-process runs, where nshot picks it)."""
    from nshot.train.checkpoint import has_checkpoints, resolve_checkpoint

    if not has_checkpoints(run_dir):
        return  # nothing saved yet: the run starts again from step 0
    if allow_earlier and not local:
        raise NshotError(
            "--allow-earlier-checkpoint resumes in-process runs (--workers 0) only: a worker "
            "group continues from the newest checkpoint Ray Train recorded. Move the damaged "
            f"checkpoint out of {run_dir} to continue from the one before it"
        )
    resolve_checkpoint(run_dir, allow_earlier=allow_earlier)


def _final_checkpoint(result: Any, run_dir: Path) -> Path | None:
    if result.checkpoint is not None and Path(result.checkpoint.path).exists():
        return Path(result.checkpoint.path)
    found = find_checkpoints(run_dir)
    return found[-1] if found else None


def _final_uri(result: Any, run_uri: str) -> str | None:
    if result.checkpoint is None:
        return None
    return f"{run_uri}/{Path(result.checkpoint.path).name}"


def _prune_local(run_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` latest checkpoints, only ever inside ``run_dir`` (a
    checkpoint reached through a link is left alone)."""
    root = Path(run_dir).resolve()
    found = find_checkpoints(run_dir)
    for old in found[:-keep] if keep > 0 else []:
        inside = root / Path(old).relative_to(run_dir)
        if inside.resolve() != inside:  # a link on the way: it may lead anywhere
            continue
        shutil.rmtree(inside, ignore_errors=True)


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=str)
