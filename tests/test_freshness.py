"""Freshness: a committed result speaks for the code only when it was made from a clean tree at a
commit that already holds the last change to the code its run executes.

The rules are checked on a throw-away git repository; then every method's committed
``results/small.json`` is held to them. The methods whose committed result is stale today are
listed by name as strict expected failures: a method whose result becomes fresh fails here until
it leaves the list, so the list only shrinks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nshot import provenance, reproduce
from nshot.errors import NshotError
from nshot.method import available
from nshot.provenance import freshness, history_available

ROOT = Path(__file__).parents[1]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def _commit(root: Path, files: dict[str, str], message: str = "change") -> str:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", message)
    return _git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """A repository with one method, ``methods/toy``, and its first commit."""
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    first = _commit(
        root,
        {
            "methods/toy/__init__.py": "",
            "methods/toy/model.py": "W = 1\n",
            "methods/toy/sub/data.py": "N = 1\n",
            "methods/toy/sub/__init__.py": "",
            "methods/toy/claims.py": "CLAIMS = ()\n",
            "methods/toy/serve.py": "S = 1\n",
            "methods/toy/paper_backbone.py": "P = 1\n",
            "methods/toy/paper/loader.py": "L = 1\n",
            "methods/toy/README.md": "toy\n",
            "methods/other/model.py": "O = 1\n",
            "platform/x.py": "X = 1\n",
        },
    )
    return root, first


def _fresh(root: Path, commit: str | None, dirty: bool | None = False, **run) -> str:
    data = {"run": {"commit": commit, "dirty": dirty, **run}} if commit is not None else {}
    return str(freshness("toy", data, root=root, method_dir="methods/toy"))


@needs_git
def test_a_result_made_at_the_last_code_change_is_fresh_until_its_code_changes(repo):
    root, first = repo
    assert _fresh(root, first) == "fresh"
    # what a reproduction does not run: its claims, its server, its paper track, prose, other
    # methods, the platform
    for rel in ("methods/toy/claims.py", "methods/toy/serve.py", "methods/toy/__init__.py",
                "methods/toy/sub/__init__.py", "methods/toy/paper_backbone.py",
                "methods/toy/paper/loader.py", "methods/toy/README.md",
                "methods/other/model.py", "platform/x.py"):  # fmt: skip
        _commit(root, {rel: "# changed\n"})
        assert _fresh(root, first) == "fresh", rel
    # what it runs, at the top or in a sub-package
    changed = _commit(root, {"methods/toy/sub/data.py": "N = 2\n"})
    stale = freshness("toy", {"run": {"commit": first, "dirty": False}}, root=root,
                      method_dir="methods/toy")  # fmt: skip
    assert str(stale) == "stale (code changed since)"
    assert changed[:12] in stale.detail and first[:12] in stale.detail
    # re-made at the change (or later): fresh again; a short sha reads the same
    assert _fresh(root, changed) == "fresh" and _fresh(root, changed[:7]) == "fresh"
    later = _commit(root, {"methods/toy/README.md": "more\n"})
    assert _fresh(root, later) == "fresh"
    _commit(root, {"methods/toy/model.py": "W = 2\n"})
    assert _fresh(root, later) == "stale (code changed since)"
    # a deleted file is a change too
    _git(root, "rm", "-q", "methods/toy/sub/data.py")
    _git(root, "commit", "-q", "-m", "rm")
    head = _git(root, "rev-parse", "HEAD")
    assert _fresh(root, head) == "fresh"


@needs_git
def test_a_result_without_a_clean_commit_is_stale(repo):
    root, first = repo
    assert _fresh(root, None) == "stale (no run record)"
    assert str(freshness("toy", {"run": {"date": "2026-12-01"}}, root=root,
                         method_dir="methods/toy")) == "stale (no commit recorded)"  # fmt: skip
    assert _fresh(root, first, dirty=True) == "stale (dirty tree)"
    assert _fresh(root, first[:7] + "+dirty", dirty=None) == "stale (dirty tree)"  # older runs
    assert _fresh(root, "0" * 40) == "stale (commit not in history)"
    assert str(freshness("toy", root / "nothing.json", root=root, method_dir="methods/toy")) == (
        "stale (no run record)"
    )


def test_without_git_history_freshness_is_unknown_unless_the_file_says_stale(tmp_path):
    plain = tmp_path / "tarball"
    plain.mkdir()
    data = {"run": {"commit": "a" * 40, "dirty": False}}
    assert freshness("toy", data, root=plain, method_dir="methods/toy").state == "unknown"
    assert not history_available(plain)
    dirty = {"run": {"commit": "a" * 40, "dirty": True}}
    assert freshness("toy", dirty, root=plain, method_dir="methods/toy").stale


@needs_git
def test_a_dirty_tree_may_not_write_committed_results(repo):
    root, _ = repo
    results = root / "methods" / "toy" / "results"
    provenance.refuse_dirty(results, root)  # clean: no error
    (root / "methods" / "toy" / "untracked.py").write_text("U = 1\n")
    provenance.refuse_dirty(results, root)  # untracked files do not count
    for i, rel in enumerate(["methods/toy/model.py", "methods/toy/claims.py",
                             "methods/toy/serve.py", "methods/other/model.py", "platform/x.py",
                             "methods/toy/sub/data.py", "methods/toy/README.md"]):  # fmt: skip
        (root / rel).write_text(f"# edit {i}\n")
    with pytest.raises(NshotError) as err:
        provenance.refuse_dirty(results / "sub", root)
    msg = str(err.value)
    assert "uncommitted changes" in msg and "and 2 more" in msg
    assert msg.count("methods/") + msg.count("platform/") == 5 + 1  # five files and the folder
    provenance.refuse_dirty(root / "elsewhere", root)  # anywhere else is the user's business
    provenance.refuse_dirty(root / "methods" / "toy", root)
    assert provenance.git_state(root)["dirty"] is True
    assert len(provenance.git_state(root)["dirty_files"]) == 7


# --------------------------------------------------------------------------- committed results

# stale today (no run record, a dirty tree, or code changed since the run): each leaves this
# list when its `small` result is re-made from a clean tree
STALE = {}
WITH_RESULTS = [
    n for n in available() if (reproduce.method_results_dir(n) / "small.json").is_file()
]


def _param(name: str):
    if name not in STALE:
        return name
    why = STALE[name]
    return pytest.param(
        name,
        marks=pytest.mark.xfail(
            strict=True,
            reason=f"stale ({why}): re-made with `nshot reproduce {name} --preset small --out "
            f"methods/{name}/results` from a clean tree, it leaves this list",
        ),
    )


@pytest.mark.parametrize("name", [_param(n) for n in WITH_RESULTS])
def test_the_committed_small_result_is_fresh(name):
    if not history_available(ROOT):
        pytest.skip("no git history here (a tarball or a shallow clone): freshness is unknown")
    fresh = freshness(name)
    if fresh.state == "unknown":
        pytest.skip(fresh.detail)
    assert fresh.state == "fresh", f"{name}: {fresh}: {fresh.detail}"


def test_the_stale_list_names_only_methods_with_committed_results():
    assert set(STALE) <= set(WITH_RESULTS)


# --------------------------------------------------------------------------- resume (--all)


def _results(path: Path, name: str, preset: str, run: dict | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"method": name, "preset": preset, "seeds": 1, "metrics": {}, "rows": {},
            "runtime_s": 1.0}  # fmt: skip
    if run is not None:
        data["run"] = run
    path.write_text(json.dumps(data))


def test_resume_runs_what_is_not_up_to_date_and_skips_the_rest(tmp_path, monkeypatch):
    """``run_all`` skips a method whose results are fresh (unless ``force``), runs the others,
    and goes on past a method that fails."""
    made: list[str] = []

    def fake_run(name, cfg, out, overrides=None, *, git=None):
        made.append(name)
        _results(Path(out) / "results.json", name, cfg.preset, {"commit": git["commit"]})
        return {}

    monkeypatch.setattr(reproduce, "run", fake_run)
    monkeypatch.setattr(
        provenance,
        "freshness",
        lambda name, data, **kw: provenance.Freshness(
            "fresh" if data["run"].get("fresh") else "stale", "", "made at abc"
        ),
    )
    _results(tmp_path / "caos" / "results.json", "caos", "smoke", {"fresh": True})
    _results(tmp_path / "tail" / "results.json", "tail", "smoke", {"fresh": False})
    logged: list[str] = []
    out = reproduce.run_all("smoke", tmp_path, only=["caos", "iclft", "tail"], log=logged.append)
    assert [(o["name"], o["status"]) for o in out] == [
        ("caos", "skipped"), ("iclft", "made"), ("tail", "made")
    ]  # fmt: skip
    assert made == ["iclft", "tail"]
    assert any(line.startswith("caos: skipped, fresh: made at abc") for line in logged)
    assert out[1]["path"] == (tmp_path / "iclft" / "results.json").resolve()
    made.clear()
    reproduce.run_all("smoke", tmp_path, only=["caos"], force=True, log=logged.append)
    assert made == ["caos"]


def test_what_is_not_up_to_date(tmp_path, monkeypatch):
    monkeypatch.setattr(
        provenance, "freshness", lambda name, data, **kw: provenance.Freshness("fresh", "", "ok")
    )
    path = tmp_path / "results.json"
    assert reproduce.up_to_date("caos", path, "smoke") is None  # nothing there
    _results(path, "caos", "smoke", {"commit": "a" * 40})
    assert reproduce.up_to_date("caos", path, "smoke") == "fresh: ok"
    assert reproduce.up_to_date("caos", path, "small") is None  # another preset
    _results(path, "caos", "smoke", {"commit": "a" * 40, "overrides": {"trials": 3}})
    assert reproduce.up_to_date("caos", path, "smoke") is None  # not the plain preset
    path.write_text("{broken")
    assert reproduce.up_to_date("caos", path, "smoke") is None
    monkeypatch.setattr(
        provenance, "freshness", lambda name, data, **kw: provenance.Freshness("stale", "x", "y")
    )
    _results(path, "caos", "smoke", {"commit": "a" * 40})
    assert reproduce.up_to_date("caos", path, "smoke") is None


def test_a_failing_method_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    def fake_run(name, cfg, out, overrides=None, *, git=None):
        if name == "caos":
            raise RuntimeError("boom\nsecond line")
        _results(Path(out) / "results.json", name, cfg.preset, {})
        return {}

    monkeypatch.setattr(reproduce, "run", fake_run)
    out = reproduce.run_all("smoke", tmp_path, only=["caos", "iclft"], log=lambda line: None)
    assert [o["status"] for o in out] == ["failed", "made"]
    assert out[0]["detail"] == "RuntimeError: boom second line"


def test_all_into_the_committed_folders_refuses_a_dirty_tree_before_any_work(monkeypatch):
    if provenance.repo_root() is None:
        pytest.skip("not a git checkout")
    monkeypatch.setattr(provenance, "dirty_files", lambda root: ["methods/caos/model.py"])
    monkeypatch.setattr(reproduce, "run", lambda *a, **k: pytest.fail("ran on a dirty tree"))
    with pytest.raises(NshotError, match=r"uncommitted changes.*methods/caos/model\.py"):
        reproduce.run_all("small", None, only=["caos"], log=lambda line: None)
    with pytest.raises(NshotError, match="unknown method"):
        reproduce.run_all("small", None, only=["nope"], log=lambda line: None)


def test_results_written_by_a_reproduction_do_not_make_the_tree_dirty(repo):
    """``reproduce --all`` writes one method's results and then runs the next from the same
    tree: results files are output, not code; a changed code file still counts."""
    from nshot.provenance import dirty_files, refuse_dirty

    root, _ = repo
    (root / "methods/other/results").mkdir(parents=True)
    (root / "methods/other/results/small.json").write_text("{}\n")
    _commit(root, {"methods/other/results/small.md": "x\n"}, "results")
    (root / "methods/other/results/small.json").write_text('{"rows": {}}\n')
    (root / "methods/other/results/small.md").write_text("y\n")
    assert dirty_files(root) == []
    refuse_dirty(root / "methods/toy/results", root)  # allowed
    (root / "methods/toy/model.py").write_text("W = 2\n")
    assert dirty_files(root) == ["methods/toy/model.py"]
    with pytest.raises(NshotError, match="methods/toy/model.py"):
        refuse_dirty(root / "methods/toy/results", root)


@needs_git
def test_comments_and_docstrings_do_not_make_a_result_stale(repo):
    """A commit that changes only comments and docstrings of the code a run executes leaves
    its result fresh; a change to what runs (a value, a name, a new file) does not."""
    root, first = repo
    _commit(root, {"methods/toy/model.py": '"""The toy model."""\n\n# the weight\nW = 1\n'})
    assert _fresh(root, first) == "fresh"
    detail = freshness("toy", {"run": {"commit": first, "dirty": False}}, root=root,
                       method_dir="methods/toy").detail  # fmt: skip
    assert "only comments and docstrings" in detail
    _commit(root, {"methods/toy/sub/data.py": "def n():\n    '''How many.'''\n    return 1\n"})
    assert _fresh(root, first) == "stale (code changed since)"  # N = 1 became a function
    made = _commit(root, {"methods/toy/README.md": "re-made\n"})
    _commit(root, {"methods/toy/sub/data.py": "def n():\n    # one\n    return 1\n"})
    assert _fresh(root, made) == "fresh"
    _commit(root, {"methods/toy/sub/extra.py": "# only a comment\n"})
    assert _fresh(root, made) == "stale (code changed since)"  # a new file of the run


# --------------------------------------------------------------------------- other committed results

# results files besides `small.json` (sub-runs, earlier runs kept) that were not made from a clean
# tree; the method's README says so where it first cites each. `small.json` is held by the test
# above (STALE). A file leaves this list when it is re-made from a clean tree.
_BEFORE = "no run record (made before run records)"
NOT_CLEAN = {
    ("atha", "clip-v7-small.json"): "dirty tree at ad0a57e",
    ("atha", "push0.05-small.json"): "dirty tree at 86c4417",
    ("atha", "push0.1-small.json"): "dirty tree at 86c4417",
    ("atha", "push0.2-small.json"): "dirty tree at 86c4417",
    ("atha", "push0.4-small.json"): "dirty tree at 86c4417",
    ("atha", "push1.6-small.json"): "dirty tree at 86c4417",
    ("atha", "textile-small.json"): "dirty tree at a3f6c74",
    ("auxbo", "small-first-run.json"): _BEFORE,
    ("auxbo", "small-heldout56.json"): _BEFORE,
    ("auxbo", "small-lcbench-perturbed.json"): _BEFORE,
    ("auxbo", "small-seed1.json"): _BEFORE,
    ("auxbo", "small-v1.json"): _BEFORE,
    ("bsr", "mae-references-small.json"): "dirty tree at a9d17f1",
    ("bsr", "no-final-norm-small.json"): "dirty tree at dce2780",
    ("bsr", "steps1000-small.json"): "dirty tree at 279e461",
    ("cfr", "epochs40-small.json"): "dirty tree at 11f1abf",
    ("cfr", "pro99-small.json"): "dirty tree at be5ba00",
    ("cfr", "theta-low-small.json"): "dirty tree at 90012f0",
    ("dirclip", "lambda-sweep.json"): "dirty tree at c5c957f",
    ("dirclip", "steps400-small.json"): "dirty tree at 42c7cc8",
    ("front", "small-v1.json"): _BEFORE,
    ("keystone", "small-v1.json"): _BEFORE,
    ("modhnn", "small-v1.json"): _BEFORE,
    ("tail", "small-v1.json"): _BEFORE,
    ("tgdt", "minilm-small.json"): "dirty tree at 09191cc",
    ("tgdt", "small-metaworld.json"): "dirty tree at 6c968af",
    ("timemode", "disc1-small.json"): "dirty tree at 2676488",
    ("timemode", "disc3-steps4x-small.json"): "dirty tree at a9d17f1",
    ("urs", "small-v1.json"): "dirty tree at fe7134e",
    ("weightspace", "small-seeds3.json"): _BEFORE,
    ("weightspace", "small-v1.json"): _BEFORE,
    ("zerounlearn", "small-capital-language.json"): _BEFORE,
    ("zerounlearn", "small-layers-4-6.json"): _BEFORE,
    ("zerounlearn", "small-subject-first.json"): _BEFORE,
    ("zerounlearn", "small-v1.json"): _BEFORE,
}


def _why_not_clean(data: dict) -> str | None:
    """Why a results file does not record a clean tree (``None``: it does). Older run records
    mark a dirty tree with ``+dirty`` on the commit and have no ``dirty`` field."""
    run = data.get("run")
    if not isinstance(run, dict) or not run:
        return _BEFORE
    commit, dirty = provenance.run_commit(run)
    if not commit:
        return "no commit recorded"
    return f"dirty tree at {commit[:7]}" if dirty else None


def _other_results() -> dict[tuple[str, str], str | None]:
    """Every results file (a JSON with ``method`` and ``rows``) in a ``methods/*/results/``
    folder except ``small.json``, with why it is not clean."""
    found = {}
    for path in sorted(ROOT.glob("methods/*/results/*.json")):
        if path.name == "small.json":
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "method" in data and "rows" in data:
            found[(path.parent.parent.name, path.name)] = _why_not_clean(data)
    return found


def test_other_committed_results_record_a_clean_tree_or_are_listed():
    found = _other_results()
    problems = [
        f"methods/{m}/results/{f}: "
        + (f"{why}: re-make it from a clean tree" if why else "clean now: it leaves NOT_CLEAN")
        + (f" (NOT_CLEAN says {NOT_CLEAN[m, f]!r})" if why and (m, f) in NOT_CLEAN else "")
        for (m, f), why in found.items()
        if why != NOT_CLEAN.get((m, f))
    ]
    problems += [
        f"methods/{m}/results/{f}: listed in NOT_CLEAN but not a committed results file"
        for m, f in set(NOT_CLEAN) - set(found)
    ]
    assert not problems, "\n".join(sorted(problems))


def test_not_clean_reads_the_run_record():
    assert _why_not_clean({"rows": {}}) == _BEFORE
    assert _why_not_clean({"run": {"commit": "86c4417+dirty"}}) == "dirty tree at 86c4417"
    assert _why_not_clean({"run": {"commit": "a" * 40, "dirty": True}}) == "dirty tree at aaaaaaa"
    assert _why_not_clean({"run": {"commit": "a" * 40, "dirty": False}}) is None
    assert _why_not_clean({"run": {"commit": "4bfeaca"}}) is None  # older record, clean tree
    assert _why_not_clean({"run": {"date": "2026-12-01"}}) == "no commit recorded"
