"""Atomic file writes: a reader sees the old file or the new one, never half of one.

``atomic_write(path, data)`` writes bytes or text; ``atomic_path(path)`` hands a temporary path
in the same directory to a writer that wants a file name (``pyarrow.parquet.write_table``, a
library's ``save``) and moves it into place when the block ends without an error. Either way the
temporary file is flushed to disk, renamed over ``path`` with ``os.replace`` (atomic on one file
system), and removed if anything fails. ``print_report(report, out)`` prints a JSON report (the
diagnostic examples' output) and writes the same text to ``out`` that way.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[Path]:
    """A temporary path beside ``path``; on a clean exit it replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600; shared caches and runs stay readable
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike[str], data: bytes | str, mode: int = 0o644) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically; returns ``path``."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, mode) as tmp:
        tmp.write_bytes(raw)
    return Path(path)


def print_report(report: Any, out: str | os.PathLike[str] | None = None) -> str:
    """Print ``report`` as JSON (indent 1) and, when ``out`` is given, write the same text there
    atomically (with a final newline); returns the text."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        atomic_write(out, text + "\n")
    return text
