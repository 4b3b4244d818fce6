"""The lean core and the extras by field (nshot.extras): a method whose extra is missing is
listed, refused in one line before Ray starts, and leaves the other methods working; the table
of methods, extras and modules agrees with pyproject.toml and with the methods' imports."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import sys
import tomllib
from pathlib import Path

import pytest
from _ray_stub import RayStarted
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import nshot.method as registry
from nshot import extras
from nshot.cli import main
from nshot.extras import METHODS, MethodExtraError
from nshot.method import available, describe, get

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
RECOG_LINE = (
    "nshot: error: method 'recog' needs the 'chem' extra: pip install 'nshot[chem]' "
    "(missing: rdkit)"
)


@pytest.fixture
def no_rdkit(monkeypatch):
    """RDKit is not installed, as far as this test can tell: ``import rdkit`` raises (a None in
    ``sys.modules``); the methods found unavailable meanwhile are forgotten afterwards."""
    monkeypatch.setitem(sys.modules, "rdkit", None)
    monkeypatch.setattr(registry, "_UNAVAILABLE", dict(registry._UNAVAILABLE))


# --------------------------------------------------------------------------- a missing extra


def test_a_method_without_its_extra_is_listed_and_refused_in_one_line(no_rdkit):
    with pytest.raises(MethodExtraError) as err:
        get("recog")
    assert f"nshot: error: {err.value}" == RECOG_LINE
    assert (err.value.method, err.value.extra, err.value.missing) == ("recog", "chem", ["rdkit"])
    assert isinstance(err.value, ImportError)  # nshot.data.MissingExtraError, an NshotError
    assert "recog" in available()
    info = describe("recog")
    assert info["extra"] == "chem" and info["missing"] == ["rdkit"]
    assert info["paper"].startswith("ReCoG") and "smoke" in info["presets"]
    # the other methods are untouched, those of other extras included
    assert get("tail").name == "tail" and get("bsr").name == "bsr"
    assert describe("tail")["extra"] is None and describe("tail")["missing"] == []
    assert describe("bsr")["extra"] == "eeg" and describe("bsr")["missing"] == []
    # scgfm needs RDKit too (its molecule row), through its own extra
    with pytest.raises(MethodExtraError, match=r"'scgfm' needs the 'graphs' extra.*rdkit"):
        get("scgfm")


@pytest.mark.usefixtures("no_rdkit", "ray_refused")
@pytest.mark.parametrize(
    "argv",
    [
        ["train", "recog", "--preset", "smoke"],
        ["tune", "recog", "--preset", "smoke", "--num-samples", "1", "--no-history"],
        ["reproduce", "recog", "--preset", "smoke"],
    ],
)
def test_the_command_line_stops_before_ray_with_the_extra_to_install(argv, capsys, tmp_path):
    where = ["--out", str(tmp_path)] if argv[0] == "reproduce" else ["--storage", str(tmp_path)]
    assert main([*argv, *where]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [RECOG_LINE]


@pytest.mark.usefixtures("no_rdkit", "ray_refused")
def test_a_method_with_its_libraries_still_reaches_ray(tmp_path):
    with pytest.raises(RayStarted):
        main(["train", "tail", "--preset", "smoke", "--storage", str(tmp_path)])


@pytest.fixture
def fake_methods(monkeypatch, tmp_path):
    """Two built-in method packages of this test's own (the folder is added to
    ``nshot.methods``' path): ``fake_chem`` imports RDKit when imported, ``fake_broken`` a
    module no extra has. Both are forgotten afterwards (the real methods stay registered: their
    modules stay imported, so that a copy of the registry could not be restored)."""
    import nshot.methods as builtin

    available()  # every real method found first, so that discovery never meets these two
    monkeypatch.setattr(registry, "_UNAVAILABLE", dict(registry._UNAVAILABLE))

    template = (
        "import {module}\n\n"
        "from nshot.method import register\n"
        "from nshot.methods.caos import CAOSMethod\n\n\n"
        "@register\n"
        "class FakeMethod(CAOSMethod):\n"
        "    name = {name!r}\n"
    )
    for name, module in (("fake_chem", "rdkit"), ("fake_broken", "nshot_no_such_module")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(template.format(name=name, module=module))
    importlib.invalidate_caches()
    monkeypatch.setattr(builtin, "__path__", [*builtin.__path__, str(tmp_path)])
    yield
    for name in ("fake_chem", "fake_broken"):
        sys.modules.pop(f"nshot.methods.{name}", None)
        registry._REGISTRY.pop(name, None)


@pytest.mark.usefixtures("no_rdkit", "fake_methods")
def test_a_method_whose_import_fails_on_an_extra_is_listed_and_refused():
    with pytest.raises(MethodExtraError) as err:
        get("fake_chem")
    assert str(err.value) == (
        "method 'fake_chem' needs the 'chem' extra: pip install 'nshot[chem]' (missing: rdkit)"
    )
    assert "fake_chem" in available()
    assert describe("fake_chem")["missing"] == ["rdkit"]
    from nshot import catalog

    assert [p.title for p in catalog.papers() if p.name == "fake_chem"] == ["fake_chem"]
    # an import failure that is not about an extra is raised as it is
    with pytest.raises(ModuleNotFoundError, match="nshot_no_such_module"):
        get("fake_broken")
    assert get("caos").name == "caos"


@pytest.mark.usefixtures("fake_methods")
def test_a_method_whose_extra_arrives_is_no_longer_refused(monkeypatch):
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "rdkit", None)
        with pytest.raises(MethodExtraError):
            get("fake_chem")
    assert get("fake_chem").name == "fake_chem"  # rdkit is installed here
    assert "fake_chem" not in registry._UNAVAILABLE


def test_the_error_pickles_for_ray_workers():
    import pickle

    err = pickle.loads(pickle.dumps(MethodExtraError("urs", "vrp", ["pyvrp", "ortools"])))
    assert str(err) == (
        "method 'urs' needs the 'vrp' extra: pip install 'nshot[vrp]' (missing: pyvrp, ortools)"
    )


# --------------------------------------------------------------------------- the table


def _extra(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The distributions an extra of pyproject.toml installs (nshot[...] references followed)."""
    out: set[str] = set()
    for text in PYPROJECT["optional-dependencies"][name]:
        req = Requirement(text)
        if canonicalize_name(req.name) == "nshot":
            for sub in sorted(req.extras - seen):
                out |= _extra(sub, seen | {name})
        else:
            out.add(canonicalize_name(req.name))
    return out


def _core() -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in PYPROJECT["dependencies"]}


def test_every_extra_of_the_table_is_in_pyproject_and_all_and_test_cover_them():
    defined = PYPROJECT["optional-dependencies"]
    field = {need.extra for need in METHODS.values()}
    assert field <= set(defined), sorted(field - set(defined))
    every = set().union(*(_extra(e) for e in field))
    assert _extra("all") == every  # all: every method's extra, nothing else
    assert _extra("test") >= _extra("all")
    assert _extra("tail-text") == _extra("text")
    # the core holds none of the field libraries
    assert not _core() & every, sorted(_core() & every)
    assert set(METHODS) <= set(available())


def _installed_closure(requirements: list[str]) -> set[str]:
    """The distributions installed for ``requirements``, their dependencies followed through
    the installed metadata (with the extras they ask for)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    stack = [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            needs = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in needs:
            dep = Requirement(text)
            if dep.marker is None or any(
                dep.marker.evaluate({"extra": e}) for e in (req.extras or {""})
            ):
                stack.append(dep)
    return {name for name, _ in seen}


def _imports(folder: Path) -> set[str]:
    """The top-level modules the Python files under ``folder`` import (anywhere in them)."""
    out: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return out


def test_the_table_names_every_field_library_a_method_imports():
    """A method that imports a library only a field extra installs declares that extra, with
    that module; a module of the table is one its extra installs."""
    field = {need.extra for need in METHODS.values()}
    field_only = set().union(*(_extra(e) for e in field)) - _installed_closure(
        PYPROJECT["dependencies"]
    )
    dists = {
        module: {canonicalize_name(d) for d in names}
        for module, names in importlib.metadata.packages_distributions().items()
    }
    for folder in sorted(p for p in (ROOT / "methods").iterdir() if (p / "__init__.py").is_file()):
        need = METHODS.get(folder.name)
        declared = set(need.modules) if need else set()
        undeclared = {m for m in _imports(folder) if dists.get(m, set()) & field_only} - declared
        assert not undeclared, f"{folder.name} imports {sorted(undeclared)}: add it to METHODS"
    for name, need in METHODS.items():
        for module in need.modules:
            assert module.isidentifier() and "." not in module, (name, module)
            if module in dists:  # installed here: the extra installs it
                assert dists[module] & _extra(need.extra), (name, module, need.extra)


def test_the_quickstart_method_needs_no_extra():
    assert extras.needs("tail") is None and extras.missing("tail") == []
    assert extras.missing_extra("tail") is None


def test_reproduce_all_skips_a_method_whose_extra_is_missing(monkeypatch):
    """``nshot reproduce --all`` goes on past a method this install cannot run (named in its
    scoreboard as skipped, with the extra to install); naming it with --only is an error."""
    from nshot import reproduce
    from nshot.extras import MethodExtraError

    real_get = reproduce.get

    def get(name):
        if name == "recog":
            raise MethodExtraError("recog", "chem", ["rdkit"])
        return real_get(name)

    monkeypatch.setattr(reproduce, "get", get)
    ran = []
    monkeypatch.setattr(reproduce, "run", lambda name, *a, **k: ran.append(name))
    out = reproduce.run_all("smoke", "/nonexistent-nshot-out", only=None, force=True,
                            log=lambda line: None)  # fmt: skip
    by = {o["name"]: o for o in out}
    assert by["recog"]["status"] == "skipped" and "nshot[chem]" in by["recog"]["detail"]
    assert "recog" not in ran and "tail" in ran
    with pytest.raises(MethodExtraError):
        reproduce.run_all("smoke", "/nonexistent-nshot-out", only=["recog"], log=lambda line: None)
