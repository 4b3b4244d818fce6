"""nshot checkpoints: safetensors weights plus JSON, never pickle.

A checkpoint is a directory::

    model.safetensors       model weights (state_dict, unwrapped from DDP)
    optimizer.safetensors   optimizer tensors (optional), keys ``state/<param>/<name>``
    state.json              format, method, versions, config, step, metrics, extra state,
                            the optimizer's non-tensor state, and the sha256 of every file

Writing (:func:`save_checkpoint`) is atomic: the files go into a hidden temporary directory,
``state.json`` last, are flushed to disk and the directory renamed into place, so a write that
fails half way (a full volume, a permission or a mount lost) leaves no checkpoint directory for
any reader to take as the newest; it raises :class:`CheckpointWriteError`.

Loading (:func:`load_checkpoint`) checks, and raises :class:`CheckpointError` with the path and
the problem for anything unexpected:

* the directory: a checkpoint directory, or a run directory whose newest checkpoint is taken; a
  newest checkpoint without ``state.json`` is an error, not silently replaced by an earlier one
  (``allow_earlier=True``, the command line's ``--allow-earlier-checkpoint``, takes the earlier
  one with a warning);
* ``state.json``: a plain file of at most 64 MiB whose JSON has the structure above (every field
  of the right type, ``step`` a non-negative integer, ``files`` a non-empty object);
* the files: only names from :data:`KNOWN_FILES` are read, each a regular file (not a symbolic
  link) directly inside the checkpoint directory: ``model.safetensors`` always, and
  ``optimizer.safetensors`` when the state has optimizer metadata; each must match its sha256;
* the safetensors headers (read without loading a tensor): dtypes, shapes and offsets consistent
  with the file, the model file no larger than the parameter limit;
* the model's size: when the checkpoint's method is registered, its config must validate, and
  the method's :meth:`~nshot.method.Method.model_budget` estimate must fit the limits of
  :mod:`nshot.train.limits` (2e9 parameters and 16 GiB of activations by default; overridden by
  ``$NSHOT_MAX_MODEL_PARAMS`` / ``$NSHOT_MAX_ACTIVATION_BYTES`` or the ``max_params`` /
  ``max_activation_bytes`` keywords) and match the number of tensor elements in
  ``model.safetensors``;
* the tensors, when read (:meth:`LoadedCheckpoint.weights`,
  :meth:`~LoadedCheckpoint.optimizer_state`): every floating-point value finite.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import stat
import struct
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from nshot.errors import CheckpointError as CheckpointError
from nshot.errors import ConfigError
from nshot.hashing import sha256_file
from nshot.train.limits import ENV_MAX_ACTIVATION_BYTES, ENV_MAX_PARAMS, resolve_limits

FORMAT = "nshot-checkpoint/1"
STATE_FILE = "state.json"
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optimizer.safetensors"
#: the only files a checkpoint's ``files`` may name (``save_checkpoint`` writes no others)
KNOWN_FILES = (MODEL_FILE, OPTIM_FILE)
MAX_STATE_BYTES = 64 * 2**20
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on a header


def _plain_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k.startswith("module."):  # DDP wrapper
            k = k[len("module.") :]
        out[k] = v.detach().to("cpu").contiguous().clone()
    return out


def flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split a torch optimizer ``state_dict`` into tensors and JSON-able metadata."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, entries in state["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state/{pid}/{name}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars.setdefault(str(pid), {})[name] = value
    meta = {"param_groups": state["param_groups"], "scalars": scalars}
    return tensors, meta


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, pid, name = key.split("/", 2)
        state.setdefault(int(pid), {})[name] = value
    for pid, entries in meta.get("scalars", {}).items():
        state.setdefault(int(pid), {}).update(entries)
    return {"state": state, "param_groups": meta["param_groups"]}


class CheckpointWriteError(OSError):
    """An :class:`OSError` raised while a checkpoint was being written: no space left
    (``ENOSPC``), permission denied (``EACCES``/``EPERM``), a read-only file system
    (``EROFS``), a directory that vanished (``ENOENT``), ... ``errno`` and ``strerror`` are the
    original error's (also when safetensors reported it inside a ``SafetensorError``),
    ``filename`` the file being written (under its final name) and ``checkpoint`` the
    checkpoint directory. It pickles with both, so a Ray Train worker's failure still says
    what it was when it reaches the driver (:mod:`nshot.train.storage_errors`)."""

    def __init__(
        self, code: int, message: str, filename: str | None = None, *, checkpoint: str | None = None
    ):
        super().__init__(code, message, filename)
        self.checkpoint = checkpoint


#: Test-only fault injection, never set outside tests: ``<ERRNO>@<step>`` (``ENOSPC@15``) makes
#: every checkpoint of that step or later fail half way through, with ``model.safetensors``
#: cut to half its size and then an ``OSError`` of that errno, as a volume that fills up does.
#: Ray Train workers receive it from the driver (:func:`nshot.train.runner.build_trainer`).
FAULT_ENV = "NSHOT_TEST_CHECKPOINT_FAULT"

_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")


def os_error_code(err: BaseException) -> int | None:
    """The errno of an :class:`OSError`, or of the I/O error a ``SafetensorError`` wraps
    (safetensors says it in its message, ``... (os error 28)``); else ``None``."""
    if isinstance(err, OSError):
        return err.errno
    if isinstance(err, SafetensorError):
        m = _OS_ERROR_CODE.search(str(err))
        return int(m.group(1)) if m else None
    return None


def _injected_fault(step: int, written: Path, shown: Path) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    name, _, at = spec.partition("@")
    code = getattr(errno, name.strip().upper(), None)
    if not isinstance(code, int) or not at.strip().isdigit():
        raise ValueError(f"${FAULT_ENV}={spec!r}: expected <ERRNO>@<step>, e.g. ENOSPC@15")
    if step < int(at):
        return
    with open(written, "r+b") as f:
        f.truncate(os.fstat(f.fileno()).st_size // 2)
    raise OSError(code, os.strerror(code), str(shown))


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a directory) to disk. A file system that cannot flush a
    directory (``EINVAL``) is let be; any other error, e.g. ``ENOSPC`` or ``EIO`` reported
    only now by a file system that allocates on flush, is raised."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if not (path.is_dir() and err.errno in (errno.EINVAL, errno.ENOTSUP, errno.EBADF)):
            raise
    finally:
        os.close(fd)


def _move_into_place(tmp: Path, path: Path) -> None:
    """Rename the finished directory ``tmp`` to ``path``; a checkpoint already at ``path``
    (the same step saved again) is moved aside first and deleted only once the new one is in
    place, so a failure leaves the old one."""
    if not os.path.lexists(path):
        os.rename(tmp, path)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
    os.rename(path, aside / path.name)
    try:
        os.rename(tmp, path)
    except OSError:
        os.rename(aside / path.name, path)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def save_checkpoint(
    path: str | os.PathLike,
    *,
    method: str,
    method_version: str,
    config: dict[str, Any],
    step: int,
    model_state: dict[str, torch.Tensor],
    metrics: dict[str, float] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory atomically: a reader sees all of it or none of it.

    The files are written into a hidden temporary directory beside ``path`` (readers skip
    hidden directories), ``state.json`` last; each file and the directory are flushed to disk
    (fsync) before the directory is renamed to ``path``, and the parent directory after it, so
    that not even a crash leaves a ``path`` with a truncated file. A write that fails removes
    the temporary directory and raises :class:`CheckpointWriteError` (an :class:`OSError`)
    naming the file, with the original errno, also for the I/O errors safetensors wraps.
    """
    from nshot import __version__

    path = Path(path)
    tmp: Path | None = None
    writing = path  # what was being written when an error came (under its final name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        writing = path / MODEL_FILE
        save_file(_plain_state_dict(model_state), str(tmp / MODEL_FILE))
        _injected_fault(step, tmp / MODEL_FILE, writing)
        files = [MODEL_FILE]
        optim_meta = None
        if optimizer_state is not None:
            writing = path / OPTIM_FILE
            tensors, optim_meta = flatten_optimizer(optimizer_state)
            save_file(tensors, str(tmp / OPTIM_FILE))
            files.append(OPTIM_FILE)
        for name in files:
            writing = path / name
            _fsync(tmp / name)
        state = {
            "format": FORMAT,
            "method": method,
            "method_version": method_version,
            "nshot_version": __version__,
            "config": config,
            "step": int(step),
            "metrics": {k: float(v) for k, v in (metrics or {}).items()},
            "extra": extra or {},
            "optimizer": optim_meta,
            "files": {f: sha256_file(tmp / f) for f in files},
        }
        writing = path / STATE_FILE
        with open(tmp / STATE_FILE, "w") as f:
            f.write(json.dumps(state, indent=1, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        writing = path
        _fsync(tmp)
        _move_into_place(tmp, path)
        _fsync(path.parent)
    except (OSError, SafetensorError) as err:
        code = os_error_code(err)
        if isinstance(err, CheckpointWriteError) or code is None:
            raise
        reason = err.strerror if isinstance(err, OSError) and err.strerror else os.strerror(code)
        raise CheckpointWriteError(code, reason, str(writing), checkpoint=str(path)) from err
    finally:
        if tmp is not None and os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return path


@dataclass
class LoadedCheckpoint:
    """A verified checkpoint: its JSON state and lazy access to its tensors."""

    path: Path
    method: str
    method_version: str
    config: dict[str, Any]
    step: int
    metrics: dict[str, float]
    extra: dict[str, Any]
    _optimizer_meta: dict[str, Any] | None = field(default=None, repr=False)

    def weights(self) -> dict[str, torch.Tensor]:
        """The model's tensors; :class:`CheckpointError` names the first non-finite one."""
        return _load_tensors(self.path, MODEL_FILE)

    def optimizer_state(self) -> dict[str, Any] | None:
        if self._optimizer_meta is None:
            return None
        tensors = _load_tensors(self.path, OPTIM_FILE)
        try:
            return unflatten_optimizer(tensors, self._optimizer_meta)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(
                f"checkpoint {self.path}: the optimizer tensors in {OPTIM_FILE} do not match "
                f"the optimizer state in {STATE_FILE} ({type(err).__name__}: {err})"
            ) from None


def _plain_file(root: Path, name: str, ckpt: Path) -> Path:
    """``root / name``, a regular file (not a symbolic link) directly inside ``root``."""
    path = root / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {ckpt} is missing {name}") from None
    except OSError as err:
        raise CheckpointError(f"checkpoint file {ckpt / name} cannot be read: {err}") from None
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(
            f"checkpoint file {ckpt / name} is a symbolic link; nshot reads only plain files "
            "inside the checkpoint directory"
        )
    if not stat.S_ISREG(st.st_mode) or path.resolve().parent != root:
        raise CheckpointError(f"checkpoint file {ckpt / name} is not a regular file")
    return path


def _load_tensors(ckpt: Path, name: str) -> dict[str, torch.Tensor]:
    path = _plain_file(Path(ckpt).resolve(), name, Path(ckpt))
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint file {path} cannot be read: {err}") from None
    for key, t in tensors.items():
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            kind = "NaN" if bool(torch.isnan(t).any()) else "inf"
            raise CheckpointError(
                f"checkpoint file {Path(ckpt) / name}: tensor {key!r} holds {kind} values "
                "(non-finite weights are never loaded)"
            )
    return tensors


def is_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / STATE_FILE).is_file()


_STEP_NAME = re.compile(r"checkpoint_(\d+)$")


def _name_step(path: Path) -> int | None:
    m = _STEP_NAME.match(path.name)
    return int(m.group(1)) if m else None


def _recorded_step(ckpt: Path) -> int | None:
    """The step in ``ckpt/state.json`` (read only from a small plain file), else ``None``."""
    p = ckpt / STATE_FILE
    try:
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_STATE_BYTES:
            return None
        step = json.loads(p.read_text()).get("step")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _step_of(ckpt: Path) -> int:
    step = _recorded_step(ckpt)
    if step is None:
        step = _name_step(ckpt)
    return -1 if step is None else step


def _looks_like_checkpoint(path: Path) -> bool:
    """A ``checkpoint_*`` directory or one holding any checkpoint file."""
    if path.name.startswith("checkpoint_"):
        return True
    return any(os.path.lexists(path / f) for f in (STATE_FILE, *KNOWN_FILES))


def _has_state(path: Path) -> bool:
    return os.path.lexists(path / STATE_FILE)


def _candidates(root: Path) -> list[Path]:
    """Checkpoint-looking directories up to three levels below ``root`` (not hidden ones:
    ``save_checkpoint`` writes into a hidden temporary directory first)."""
    out: list[Path] = []
    for depth in ("*", "*/*", "*/*/*"):
        for p in root.glob(depth):
            rel = p.relative_to(root).parts
            if any(part.startswith(".") for part in rel) or not p.is_dir():
                continue
            if _looks_like_checkpoint(p):
                out.append(p)
    # a checkpoint's own files are never checkpoints: drop directories nested in a candidate
    found = set(out)
    return [p for p in out if not any(a in found for a in p.parents)]


def has_checkpoints(root: str | os.PathLike) -> bool:
    """Whether ``root`` is, or holds up to three levels down, a checkpoint-looking directory
    (complete or not)."""
    root = Path(root)
    return root.is_dir() and (_looks_like_checkpoint(root) or bool(_candidates(root)))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def find_checkpoints(root: str | os.PathLike) -> list[Path]:
    """All checkpoint directories (with a ``state.json``) under ``root`` (itself, or up to
    three levels down), oldest first: by the step in ``state.json`` (or, where it cannot be
    read, the step in the directory's name ``checkpoint_<step>``), then modification time."""
    root = Path(root)
    if _has_state(root):
        return [root]
    found = [p for p in _candidates(root) if _has_state(p)]
    found.sort(key=lambda p: (_step_of(p), _mtime(p)))
    return found


def resolve_checkpoint(path: str | os.PathLike, *, allow_earlier: bool = False) -> Path:
    """A checkpoint directory, or the newest checkpoint inside a run directory.

    The newest is the checkpoint-looking directory (``checkpoint_<step>``, or any directory
    holding a checkpoint file) with the highest step (from ``state.json``, else from its name),
    then the latest modification time. When the newest has no ``state.json`` it is incomplete
    or damaged: :class:`CheckpointError` names it, unless ``allow_earlier`` is set, which takes
    the newest complete checkpoint before it and says so with a :class:`UserWarning`.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is not a directory")
    if _has_state(path):
        return path
    candidates = _candidates(path)
    if _looks_like_checkpoint(path) and not candidates:
        raise CheckpointError(
            f"checkpoint {path} has no {STATE_FILE}: it is incomplete or damaged and cannot be "
            "verified"
        )
    complete = [p for p in candidates if _has_state(p)]
    if not candidates:
        raise CheckpointError(f"no nshot checkpoint (a directory with {STATE_FILE}) under {path}")

    best = max(complete, key=lambda p: (_step_of(p), _mtime(p))) if complete else None

    def newer(p: Path) -> bool:  # an incomplete directory newer than the best complete one?
        if best is None:
            return True
        step = _name_step(p)
        if step is None:  # no step in its name: modification time decides
            return _mtime(p) > _mtime(best)
        return (step, _mtime(p)) > (_step_of(best), _mtime(best))

    broken = [p for p in candidates if not _has_state(p) and newer(p)]
    if not broken:
        assert best is not None
        return best
    newest = max(broken, key=lambda p: (_name_step(p) or -1, _mtime(p)))
    if best is None:
        raise CheckpointError(
            f"the newest checkpoint under {path}, {newest}, has no {STATE_FILE} (incomplete or "
            "damaged) and there is no earlier checkpoint"
        )
    if not allow_earlier:
        raise CheckpointError(
            f"the newest checkpoint under {path}, {newest}, has no {STATE_FILE} (incomplete or "
            f"damaged); an earlier checkpoint exists, {best}: pass --allow-earlier-checkpoint "
            "(allow_earlier=True) to use it, or give that checkpoint's path"
        )
    warnings.warn(
        f"the newest checkpoint under {path}, {newest}, has no {STATE_FILE}; using the earlier "
        f"checkpoint {best} (allow_earlier)",
        UserWarning,
        stacklevel=2,
    )
    return best


# --------------------------------------------------------------------------- state.json


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_state(ckpt: Path, root: Path) -> dict[str, Any]:
    where = ckpt / STATE_FILE
    path = _plain_file(root, STATE_FILE, ckpt)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_STATE_BYTES + 1)
    except OSError as err:
        raise CheckpointError(f"{where} cannot be read: {err}") from None
    if len(raw) > MAX_STATE_BYTES:
        raise CheckpointError(f"{where} is larger than {MAX_STATE_BYTES >> 20} MiB")
    try:
        state = json.loads(raw)
    except (ValueError, RecursionError) as err:
        msg = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise CheckpointError(f"{where} is not valid JSON: {msg}") from None
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{where} is not an {FORMAT} checkpoint: expected a JSON object, got "
            f"{type(state).__name__}"
        )
    if state.get("format") != FORMAT:
        raise CheckpointError(
            f"{ckpt} is not an {FORMAT} checkpoint ({STATE_FILE}: format "
            f"{_show(state.get('format'))})"
        )
    return state


def _validate_state(state: dict[str, Any], ckpt: Path) -> dict[str, Any]:
    """The fields of ``state``, checked and normalised; one error line for anything else."""
    where = ckpt / STATE_FILE

    def bad(name: str, expected: str) -> CheckpointError:
        if name not in state:
            return CheckpointError(f"{where}: field '{name}' is missing ({expected})")
        return CheckpointError(
            f"{where}: field '{name}' must be {expected}, got {_show(state[name])}"
        )

    method = state.get("method")
    if not isinstance(method, str) or not method:
        raise bad("method", "the method's name (a string)")
    version = state.get("method_version", "")
    if isinstance(version, bool) or not isinstance(version, str | int | float):
        raise bad("method_version", "a string")
    config = state.get("config")
    if not isinstance(config, dict):
        raise bad("config", "an object (the method's config)")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad("step", "a non-negative integer")
    metrics = state.get("metrics", {})
    if not isinstance(metrics, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()
    ):
        raise bad("metrics", "an object of numbers")
    extra = state.get("extra", {})
    if not isinstance(extra, dict):
        raise bad("extra", "an object")
    optimizer = state.get("optimizer")
    if optimizer is not None:
        scalars = optimizer.get("scalars", {}) if isinstance(optimizer, dict) else None
        if (
            not isinstance(optimizer, dict)
            or not isinstance(optimizer.get("param_groups"), list)
            or not all(isinstance(g, dict) for g in optimizer["param_groups"])
            or not isinstance(scalars, dict)
            or not all(k.isdigit() and isinstance(v, dict) for k, v in scalars.items())
        ):
            raise bad("optimizer", "null or an object with 'param_groups' and 'scalars'")
    files = state.get("files")
    if not isinstance(files, dict):
        raise bad("files", f"an object mapping {MODEL_FILE} (and {OPTIM_FILE}) to sha256s")
    if not files:
        raise CheckpointError(
            f"checkpoint {ckpt} is corrupt: {STATE_FILE} lists no files (it needs {MODEL_FILE})"
        )
    for name, digest in files.items():
        if name not in KNOWN_FILES:
            raise CheckpointError(
                f"checkpoint {ckpt} is corrupt: {STATE_FILE} names the file {_show(name, 300)}; a "
                f"checkpoint holds only {', '.join(KNOWN_FILES)} and nothing else is read"
            )
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise CheckpointError(
                f"{where}: the sha256 of {name} must be 64 hex digits, got {_show(digest)}"
            )
    if MODEL_FILE not in files:
        raise CheckpointError(
            f"checkpoint {ckpt} is corrupt: {STATE_FILE} does not list {MODEL_FILE}"
        )
    if optimizer is not None and OPTIM_FILE not in files:
        raise CheckpointError(
            f"checkpoint {ckpt} is corrupt: {STATE_FILE} has optimizer state but does not list "
            f"{OPTIM_FILE}"
        )
    return {
        "method": method,
        "method_version": str(version),
        "config": config,
        "step": step,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "extra": extra,
        "optimizer": optimizer,
        "files": files,
    }


# --------------------------------------------------------------------------- safetensors headers

_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def safetensors_numel(path: Path, shown: Path | None = None) -> int:
    """Tensor elements declared by a safetensors file's header, read without loading a tensor.

    Refuses a header that is too long, not JSON, names an unknown dtype, or declares shapes or
    offsets inconsistent with each other or with the file's size.
    """
    shown = shown or path
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"checkpoint file {shown} is too short for a safetensors header")
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise CheckpointError(
                f"checkpoint file {shown}: the safetensors header declares {n:,} bytes (the file "
                f"has {size:,}; at most {MAX_HEADER_BYTES:,})"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise CheckpointError(
            f"checkpoint file {shown}: the safetensors header is not JSON"
        ) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"checkpoint file {shown}: the safetensors header is not an object")
    data_len = size - 8 - n
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise CheckpointError(f"checkpoint file {shown}: __metadata__ is not an object")
            continue
        where = f"checkpoint file {shown}: tensor {_show(name)} in the safetensors header"
        if not isinstance(info, dict):
            raise CheckpointError(f"{where} is not an object")
        itemsize = _DTYPE_BYTES.get(info.get("dtype"))  # type: ignore[arg-type]
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if itemsize is None:
            raise CheckpointError(f"{where} has an unknown dtype {_show(info.get('dtype'))}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise CheckpointError(f"{where} has an invalid shape {_show(shape)}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_count(o) for o in offsets)
        ):
            raise CheckpointError(f"{where} has invalid data_offsets {_show(offsets)}")
        numel = math.prod(shape)
        begin, end = offsets
        if end < begin or end > data_len or end - begin != numel * itemsize:
            raise CheckpointError(
                f"{where} declares {numel:,} {info['dtype']} values at bytes {begin:,}-{end:,}, "
                f"which the file ({data_len:,} data bytes) cannot hold"
            )
        total += numel
    return total


# --------------------------------------------------------------------------- model size


def _registered(name: str) -> Any:
    """The registered method ``name`` (an instance), else ``None``; a built-in method is
    imported alone, without discovering every other one (:func:`nshot.method.get`)."""
    from nshot import method as registry

    try:
        return registry.get(name)
    except registry.UnknownMethodError:
        return None


def _check_model_size(
    ckpt: Path,
    fields: dict[str, Any],
    weights_numel: int,
    max_params: int | float | None,
    max_activation_bytes: int | float | None,
) -> None:
    limit_p, limit_a = resolve_limits(max_params, max_activation_bytes)
    method = _registered(fields["method"])
    if method is not None:
        _check_budget(ckpt, fields, method, weights_numel, limit_p, limit_a)
    if weights_numel > limit_p:
        raise CheckpointError(
            f"checkpoint file {ckpt / MODEL_FILE} holds {weights_numel:,} tensor elements, more "
            f"parameters than the limit of {limit_p:,} (raise it with ${ENV_MAX_PARAMS} or "
            "max_params=)"
        )


def _check_budget(
    ckpt: Path, fields: dict[str, Any], method: Any, weights_numel: int, limit_p: int, limit_a: int
) -> None:
    try:
        cfg = method.config_from_dict(fields["config"])
    except ConfigError as err:
        raise CheckpointError(
            f"checkpoint {ckpt}: the config in {STATE_FILE} is not a valid {fields['method']} "
            f"config: {err}"
        ) from None
    try:
        budget = method.model_budget(cfg, fields["extra"])
    except Exception as err:  # an estimate that cannot be made is no permission to build
        raise CheckpointError(
            f"checkpoint {ckpt}: the model it describes is refused before it is built "
            f"({type(err).__name__}: {err})"
        ) from None
    if budget is None:
        return
    if budget.params > limit_p:
        raise CheckpointError(
            f"checkpoint {ckpt}: its config builds a {fields['method']} model of "
            f"{budget.params:,} parameters, over the limit of {limit_p:,} parameters (raise it "
            f"with ${ENV_MAX_PARAMS} or max_params= if this machine can hold it)"
        )
    if budget.activation_bytes > limit_a:
        raise CheckpointError(
            f"checkpoint {ckpt}: its config's {fields['method']} model needs about "
            f"{budget.activation_bytes / 2**30:,.2f} GiB of activation memory per request "
            f"({budget.activation_bytes:,} bytes), over the limit of {limit_a:,} bytes (raise "
            f"it with ${ENV_MAX_ACTIVATION_BYTES} or max_activation_bytes=)"
        )
    if budget.weights_numel is not None and budget.weights_numel != weights_numel:
        raise CheckpointError(
            f"checkpoint file {ckpt / MODEL_FILE} holds {weights_numel:,} tensor elements, but "
            f"the config in {STATE_FILE} builds a {fields['method']} model whose weights have "
            f"{budget.weights_numel:,}: the config and the weights do not match"
        )


def load_checkpoint(
    path: str | os.PathLike,
    method: str | None = None,
    *,
    allow_earlier: bool = False,
    max_params: int | float | None = None,
    max_activation_bytes: int | float | None = None,
) -> LoadedCheckpoint:
    """Load and verify a checkpoint (a checkpoint dir or a run dir: its newest checkpoint).

    ``method``: the method the checkpoint must belong to. ``allow_earlier``: when a run
    directory's newest checkpoint has no ``state.json``, take the earlier one (with a warning)
    instead of raising. ``max_params`` / ``max_activation_bytes``: the model-size limits
    (default ``$NSHOT_MAX_MODEL_PARAMS``, ``$NSHOT_MAX_ACTIVATION_BYTES``, else 2e9 parameters
    and 16 GiB; see :mod:`nshot.train.limits`). Every check is listed in this module's
    docstring; any failure is a :class:`CheckpointError` naming the path and the problem.
    Tensors are read later, by :meth:`LoadedCheckpoint.weights`.
    """
    ckpt = resolve_checkpoint(path, allow_earlier=allow_earlier)
    root = ckpt.resolve()
    fields = _validate_state(_read_state(ckpt, root), ckpt)
    for fname, digest in fields["files"].items():
        fpath = _plain_file(root, fname, ckpt)
        if sha256_file(fpath) != digest:
            raise CheckpointError(
                f"checkpoint file {ckpt / fname} is corrupt (sha256 differs from {STATE_FILE})"
            )
    if method is not None and fields["method"] != method:
        raise CheckpointError(
            f"checkpoint {ckpt} belongs to method {fields['method']!r}, not {method!r}"
        )
    numel = safetensors_numel(root / MODEL_FILE, ckpt / MODEL_FILE)
    if OPTIM_FILE in fields["files"]:
        safetensors_numel(root / OPTIM_FILE, ckpt / OPTIM_FILE)
    _check_model_size(ckpt, fields, numel, max_params, max_activation_bytes)
    return LoadedCheckpoint(
        path=ckpt,
        method=fields["method"],
        method_version=fields["method_version"],
        config=fields["config"],
        step=fields["step"],
        metrics=fields["metrics"],
        extra=fields["extra"],
        _optimizer_meta=fields["optimizer"],
    )
