"""Where a result comes from, and whether it still speaks for the code: git state and freshness.

``nshot reproduce`` records in every results file the commit it ran from (full sha) and whether
the tree was dirty (:func:`git_state`). A committed result is *fresh* when it was made from a
clean tree at a commit that already holds the last change to the code its run executes
(:func:`freshness`): any ``.py`` under ``methods/<name>/`` except ``claims.py`` (the claims are
re-evaluated without a re-run), ``serve.py`` and ``__init__.py`` (not run by a reproduction) and
files or folders whose name starts with ``paper`` (the real-backbone track, which the ``small``
preset does not run). Otherwise it is *stale*, with one short reason (:data:`REASONS`) and a
longer detail. Commits that change only comments and docstrings of that code (the same syntax
tree: :func:`same_code`) do not make a result stale. Without git or without the full history (a tarball, a shallow clone) freshness is
*unknown* unless the results file alone shows the result stale.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the short reasons a result is stale, in the order they are looked for
REASONS = ("no run record", "no commit recorded", "dirty tree", "commit not in history",
           "code changed since")  # fmt: skip
# the files under methods/<name>/ whose changes do not make a committed result stale
NOT_RUN = ("claims.py", "serve.py", "__init__.py")


def method_results_dir(name: str) -> Path:
    """The ``results`` folder inside a registered method's package (the committed results)."""
    import inspect

    from nshot.method import get

    return Path(inspect.getfile(type(get(name)))).parent / "results"


def _git(args: list[str], cwd: Path, timeout: float = 20) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _out(args: list[str], cwd: Path) -> str | None:
    res = _git(args, cwd)
    if res is None or res.returncode != 0:
        return None
    return res.stdout.strip() or None


def repo_root(start: Path | None = None) -> Path | None:
    """The root of the git checkout nshot runs from (``None``: not a checkout)."""
    start = start or Path(__file__).resolve().parent
    root = _out(["rev-parse", "--show-toplevel"], start)
    return Path(root).resolve() if root else None


def _is_results_file(rel: str) -> bool:
    parts = Path(rel).parts
    return len(parts) >= 3 and parts[0] == "methods" and parts[2] == "results"


def dirty_files(root: Path) -> list[str]:
    """Tracked files with changes not committed (staged or not); untracked files do not count,
    nor do the results files in ``methods/<name>/results/`` (what a reproduction writes, not
    code it runs: ``nshot reproduce --all`` writes one method's results, then runs the next)."""
    res = _git(["status", "--porcelain", "--untracked-files=no"], root)
    if res is None or res.returncode != 0:
        return []
    files = [line[3:].split(" -> ")[-1] for line in res.stdout.splitlines() if line.strip()]
    return [f for f in files if not _is_results_file(f)]


def git_state(root: Path | None = None) -> dict[str, Any]:
    """``{"commit": full sha | None, "dirty": bool | None, "dirty_files": [...]}`` of the
    checkout nshot runs from (``None``: not a git checkout)."""
    root = root or repo_root()
    commit = _out(["rev-parse", "HEAD"], root) if root else None
    if commit is None:
        return {"commit": None, "dirty": None, "dirty_files": []}
    files = dirty_files(root)  # type: ignore[arg-type]
    return {"commit": commit, "dirty": bool(files), "dirty_files": files}


def history_available(root: Path | None = None) -> bool:
    """Whether freshness can be decided here: a git checkout with its full history."""
    root = root or repo_root()
    if root is None:
        return False
    return _out(["rev-parse", "--is-shallow-repository"], root) == "false"


def in_committed_results(path: Path, root: Path | None = None) -> bool:
    """Whether ``path`` lies in a ``methods/<name>/results/`` folder of the repository."""
    root = root or repo_root()
    if root is None:
        return False
    try:
        parts = Path(path).expanduser().resolve().relative_to(root).parts
    except ValueError:
        return False
    return len(parts) >= 3 and parts[0] == "methods" and parts[2] == "results"


def refuse_dirty(dest: Path, root: Path | None = None) -> None:
    """Raise :class:`~nshot.errors.NshotError` when ``dest`` is a committed results folder and
    the tree has uncommitted changes to tracked files (a result there must name the commit that
    made it)."""
    from nshot.errors import NshotError

    root = root or repo_root()
    if root is None or not in_committed_results(dest, root):
        return
    files = dirty_files(root)
    if files:
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        raise NshotError(
            f"{dest} holds committed results: the tree has uncommitted changes to tracked files "
            f"({shown}); commit them first (or write elsewhere with --out DIR)"
        )


def code_pathspecs(method_dir: str) -> list[str]:
    """git pathspecs for the code a method's reproduction runs (see the module's docstring)."""
    d = method_dir.rstrip("/")
    return [
        f":(glob){d}/**/*.py",
        *(f":(glob,exclude){d}/**/{name}" for name in NOT_RUN),
        f":(glob,exclude){d}/**/paper*",
        f":(glob,exclude){d}/**/paper*/**",
    ]


def last_code_commit(method_dir: str, root: Path) -> str | None:
    """The last commit that changed the code of the method in ``method_dir`` (relative to
    ``root``)."""
    return _out(["log", "-1", "--format=%H", "--", *code_pathspecs(method_dir)], root)


@dataclass(frozen=True)
class Freshness:
    """``state``: ``"fresh"``, ``"stale"`` or ``"unknown"``; ``reason``: one of :data:`REASONS`
    (empty when fresh); ``detail``: the reason with its commits."""

    state: str
    reason: str = ""
    detail: str = ""

    @property
    def stale(self) -> bool:
        return self.state == "stale"

    def __str__(self) -> str:
        return self.state + (f" ({self.reason})" if self.reason else "")


def run_commit(run: dict[str, Any]) -> tuple[str | None, bool | None]:
    """The commit and dirtiness a run block records (older blocks mark a dirty tree with a
    ``+dirty`` suffix on the commit)."""
    commit = run.get("commit")
    dirty = run.get("dirty")
    if isinstance(commit, str) and commit.endswith("+dirty"):
        commit, dirty = commit[: -len("+dirty")], True
    return (commit or None), dirty


def freshness(
    name: str,
    results: str | Path | dict[str, Any] | None = None,
    *,
    root: Path | None = None,
    method_dir: str | None = None,
) -> Freshness:
    """Whether the results of method ``name`` (a path, a loaded results dict, or by default its
    committed ``results/small.json``) still speak for the code (see the module's docstring).

    ``method_dir``: the method's folder relative to ``root`` (default: where the registered
    method's package lies)."""
    import json

    if results is None or isinstance(results, str | Path):
        if results is None:
            results = method_results_dir(name) / "small.json"
        try:
            data = json.loads(Path(results).read_text())
        except (OSError, ValueError):
            return Freshness("stale", "no run record", f"{results}: no results to read")
    else:
        data = results
    run = data.get("run") if isinstance(data, dict) else None
    if not isinstance(run, dict) or not run:
        return Freshness("stale", "no run record", "the results record no run (commit, tree)")
    commit, dirty = run_commit(run)
    if not commit:
        return Freshness("stale", "no commit recorded", "the run recorded no git commit")
    if dirty:
        return Freshness("stale", "dirty tree", f"made from a dirty tree at {commit[:12]}")
    root = root or repo_root()
    if root is None or not history_available(root):
        return Freshness("unknown", "", "no git history here to compare the run's commit with")
    if method_dir is None:
        try:
            method_dir = method_results_dir(name).parent.resolve().relative_to(root).as_posix()
        except ValueError:
            return Freshness("unknown", "", f"{name} is not part of this repository")
    known = _git(["cat-file", "-e", f"{commit}^{{commit}}"], root)
    if known is None or known.returncode != 0:
        return Freshness(
            "stale", "commit not in history", f"the run's commit {commit} is not in this history"
        )
    last = last_code_commit(method_dir, root)
    if last is None:
        return Freshness("fresh", "", f"made at {commit[:12]}; no code history")
    res = _git(["merge-base", "--is-ancestor", last, commit], root)
    if res is None or res.returncode not in (0, 1):
        return Freshness("unknown", "", f"git could not compare {last[:12]} with {commit[:12]}")
    if res.returncode == 1:
        if same_code(commit, last, method_dir, root):
            return Freshness(
                "fresh",
                "",
                f"made at {commit[:12]}, clean tree; later commits changed only comments and "
                f"docstrings of the code it runs (last at {last[:12]})",
            )
        return Freshness(
            "stale",
            "code changed since",
            f"made at {commit[:12]}; the code it runs changed at {last[:12]}",
        )
    return Freshness("fresh", "", f"made at {commit[:12]}, clean tree; code unchanged since")


def code_fingerprint(source: str) -> str | None:
    """What a Python file runs, without its comments and docstrings: the dump of its syntax
    tree with every docstring removed (``None`` when it does not parse)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def same_code(old: str, new: str, method_dir: str, root: Path) -> bool:
    """Whether the code a method's run executes is the same at commits ``old`` and ``new`` up to
    comments and docstrings (no file of it added, removed or changed otherwise)."""
    diff = _git(["diff", "--name-status", old, new, "--", *code_pathspecs(method_dir)], root)
    if diff is None or diff.returncode != 0:
        return False
    for line in diff.stdout.splitlines():
        status, *paths = line.split("\t")
        if status != "M" or len(paths) != 1:
            return False  # a file of the run added, removed or renamed
        before = _out(["show", f"{old}:{paths[0]}"], root)
        after = _out(["show", f"{new}:{paths[0]}"], root)
        if before is None or after is None:
            return False
        fp = code_fingerprint(before)
        if fp is None or fp != code_fingerprint(after):
            return False
    return True
