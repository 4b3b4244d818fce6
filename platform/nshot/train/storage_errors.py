"""A storage error while a run writes a checkpoint, told as one line.

When the run's storage fills up, refuses a write, turns read-only or disappears, the checkpoint
writer raises :class:`~nshot.train.checkpoint.CheckpointWriteError` (an ``OSError``). In Ray
Train's local mode it reaches :func:`nshot.train.fit` as it was raised; from a worker group
it arrives wrapped (``ray.train.WorkerGroupError`` holding each rank's exception, itself
wrapped with its traceback text; ``ray.train.ControllerError`` for the controller's own
writes). :func:`find_storage_fault` unwraps those, and :class:`CheckpointStorageError` is the
:class:`~nshot.errors.StorageError` the user reads: the path, what happened, the newest complete
checkpoint (the one a resume continues from, and ``nshot eval`` reads) and the command that
resumes the run once the storage is fixed.
"""

from __future__ import annotations

import errno
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nshot.errors import StorageError
from nshot.train.checkpoint import CheckpointWriteError, os_error_code

#: what each storage errno means to the user, and what to do (to ``{storage}``) before resuming
REASONS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on device", "free space on the volume of {storage}"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota of {storage}"),
    errno.EACCES: ("permission denied", "make {storage} writable for this user"),
    errno.EPERM: ("operation not permitted", "make {storage} writable for this user"),
    errno.EROFS: ("read-only file system", "mount {storage} read-write"),
    errno.ENOENT: (
        "a directory vanished",
        "restore the missing directory in {storage} (or remount its volume)",
    ),
}


@dataclass(frozen=True)
class StorageFault:
    """One storage error: its errno, the file or directory the write failed on, the
    checkpoint being written (``None`` when the write was not a checkpoint's), the exception
    that said so, and the traceback text Ray Train carried with it from a worker (if any)."""

    errno: int
    path: str | None
    checkpoint: str | None
    error: BaseException
    worker_traceback: str | None = None


def _inner(exc: BaseException) -> list[BaseException]:
    """The exceptions ``exc`` wraps: a chained cause or context, a Ray Train worker group's
    per-rank failures, the user exception Ray Train carries with its traceback text, a
    controller's failure, a Ray task's cause."""
    out: list[BaseException] = []
    failures = getattr(exc, "worker_failures", None)
    if isinstance(failures, dict):
        out += [e for _, e in sorted(failures.items(), key=lambda kv: str(kv[0]))]
    for attr in ("_base_exc", "controller_failure", "cause", "__cause__", "__context__"):
        inner = getattr(exc, attr, None)
        if isinstance(inner, BaseException):
            out.append(inner)
    return out


def _inside(path: str | None, root: Path | None) -> bool:
    if path is None or root is None:
        return False
    try:
        return Path(os.path.abspath(path)).is_relative_to(Path(os.path.abspath(root)))
    except (TypeError, ValueError):
        return False


def find_storage_fault(
    exc: BaseException, run_dir: str | os.PathLike | None = None
) -> StorageFault | None:
    """The storage error inside ``exc``, else ``None``.

    That is a :class:`CheckpointWriteError` (any errno: the checkpoint writer raised it), or
    an ``OSError`` / ``SafetensorError`` with one of the errnos of :data:`REASONS` about a
    path inside ``run_dir`` (a write of Ray Train's own into the run directory). An error
    that is neither (a bug, a missing data file) is left as it is."""
    root = Path(run_dir) if run_dir is not None and not _is_uri(run_dir) else None
    seen: set[int] = set()
    todo: list[tuple[BaseException, str | None]] = [(exc, None)]
    while todo:
        err, text = todo.pop(0)
        if id(err) in seen or len(seen) > 64:
            continue
        seen.add(id(err))
        code = os_error_code(err)
        if isinstance(err, CheckpointWriteError) and code is not None:
            return StorageFault(code, err.filename, err.checkpoint, err, text)
        if code in REASONS:
            path = getattr(err, "filename", None)
            if _inside(path, root):
                return StorageFault(code, str(path), None, err, text)
        carried = getattr(err, "_traceback_str", None)  # Ray Train's wrapper of a worker's error
        text = carried if isinstance(carried, str) else text
        todo += [(inner, text) for inner in _inner(err)]
    return None


def _is_uri(path: str | os.PathLike) -> bool:
    scheme, sep, _ = str(path).partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum()


def describe(code: int) -> tuple[str, str]:
    """What ``code`` means and what to do, for :data:`REASONS`'s errnos and any other."""
    if code in REASONS:
        return REASONS[code]
    return os.strerror(code).lower(), "fix {storage}"


def newest_complete_checkpoint(run_dir: str | os.PathLike) -> tuple[Path, int] | None:
    """The newest checkpoint in a local ``run_dir`` that verifies (:func:`load_checkpoint`),
    with its step; ``None`` when there is none (or the run directory is remote or gone)."""
    from nshot.errors import NshotError
    from nshot.train.checkpoint import find_checkpoints, load_checkpoint

    if _is_uri(run_dir) or not Path(run_dir).is_dir():
        return None
    try:
        found = find_checkpoints(run_dir)
    except OSError:
        return None
    for ckpt in reversed(found[-5:]):
        try:
            loaded = load_checkpoint(ckpt)
        except (NshotError, OSError):
            continue
        return loaded.path, loaded.step
    return None


class CheckpointStorageError(StorageError):
    """A run stopped by a storage error; :meth:`with_command` tells it with another spelling
    of the command that resumes the run (the command line's own)."""

    def __init__(
        self,
        fault: StorageFault,
        *,
        storage: str | os.PathLike,
        run_dir: str | os.PathLike,
        newest: tuple[Path, int] | None,
        command: Sequence[str],
        resume: bool,
    ):
        self.fault = fault
        self.storage = str(storage)
        self.run_dir = str(run_dir)
        self.newest = newest
        self.command = list(command)
        self.resume = resume
        super().__init__(storage_error_message(fault, **self._parts()))

    def _parts(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "newest": self.newest,
            "command": self.command,
            "resume": self.resume,
        }

    def with_command(self, command: Sequence[str]) -> CheckpointStorageError:
        """The same error with ``command`` as the command that continues the run."""
        err = CheckpointStorageError(
            self.fault,
            storage=self.storage,
            run_dir=self.run_dir,
            newest=self.newest,
            command=command,
            resume=self.resume,
        )
        err.__cause__ = self.__cause__
        return err


def storage_error_message(
    fault: StorageFault,
    *,
    storage: str | os.PathLike,
    newest: tuple[Path, int] | None,
    command: Sequence[str],
    resume: bool = True,
) -> str:
    """One line: what was written where, what happened, the newest complete checkpoint
    (path and step, or "none yet"), and the command that continues (``resume``) or starts
    the run again."""
    what, todo = describe(fault.errno)
    name = errno.errorcode.get(fault.errno, f"errno {fault.errno}")
    where = f"writing checkpoint {fault.checkpoint}" if fault.checkpoint else "writing the run"
    on = f" on {fault.path}" if fault.path and fault.path != fault.checkpoint else ""
    kept = f"{newest[0]} (step {newest[1]})" if newest else "none yet"
    again = "resume with" if resume else "start the run again with"
    return (
        f"storage error {where}: {what} ({name}{on}); storage: {storage}; newest complete "
        f"checkpoint: {kept}; {todo.format(storage=storage)}, then {again}: {shlex.join(command)}"
    )
