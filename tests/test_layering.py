"""The import graph of nshot (platform and methods): no loops, no method importing another, no
platform module reaching into a method (only the contract), and inside a method only its
package imports ``method.py`` (the face that imports the rest).

The graph is read from the source with :mod:`ast` (nothing is imported): every ``import`` and
``from ... import`` counts, at module level or inside a function (a lazy import is still a
dependency), and so does one under ``if TYPE_CHECKING:`` (a type the module names is one it
depends on). ``from pkg import name`` depends on the
submodule ``pkg.name`` when there is one, else on the package ``pkg`` (its ``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ((ROOT / "platform" / "nshot", "nshot"), (ROOT / "methods", "nshot.methods"))


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for base, pkg in PACKAGES:
        for f in base.rglob("*.py"):
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [f"{src}.{a.name}" for a in node.names] + [src]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                # a submodule importing its own package's __init__ is not a loop of modules
                if target and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
                    break  # the most specific module named by this import
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(comp)
    return found


def test_the_cycle_finder_finds_a_loop_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_loop():
    assert [sorted(c) for c in cycles(import_graph())] == []


def test_no_method_imports_another_and_the_platform_reaches_none():
    graph = import_graph()
    for mod, deps in graph.items():
        if not mod.startswith("nshot.methods."):
            continue
        own = ".".join(mod.split(".")[:3])
        for dep in deps:
            if dep.startswith("nshot.methods.") and dep != "nshot.methods":
                assert dep.startswith(own), f"{mod} imports another method: {dep}"
    reach = {
        mod: sorted(d for d in deps if d.startswith("nshot.methods."))
        for mod, deps in graph.items()
        if not mod.startswith("nshot.methods") and any(d.startswith("nshot.methods.") for d in deps)
    }
    assert reach == {}, "the platform reaches a method only through the contract"


def test_inside_a_method_only_its_package_imports_method_py():
    graph = import_graph()
    importers = {
        mod
        for mod, deps in graph.items()
        if mod.count(".") >= 3  # a module inside a method package, not the package itself
        for dep in deps
        if dep.startswith("nshot.methods.") and dep.endswith(".method")
    }
    assert importers == set()


def test_looking_up_one_method_imports_that_method_alone():
    """`get(name)` runs in every Ray Train worker, Tune trial and Serve replica: it imports the
    built-in method asked for and no other (all 19 cost about 4 s of CPU per process); an unknown
    name still lists every method."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from nshot.method import get, UnknownMethodError\n"
        "get('caos')\n"
        "print(sorted({m.split('.')[2] for m in sys.modules if m.startswith('nshot.methods.')}))\n"
        "try:\n"
        "    get('no_such_method')\n"
        "except UnknownMethodError as e:\n"
        "    print('tail' in str(e) and 'caos' in str(e))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split("\n")
    assert out[0] == "['caos']" and out[1] == "True", out
