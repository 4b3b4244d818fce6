"""Docstrings of Python standard-library modules, read in a clean interpreter.

The texts of :func:`nshot.data.sources.text_table` and of the tiny LMs' corpus
(:mod:`nshot.data.lmtext`) are the first paragraphs of the docstrings of a module's public
functions and classes and of their public methods and properties. Read from the live objects of
the calling process they depend on what that process imported before: libraries add methods to
standard-library classes (``logging.Logger``) or replace functions (in ``inspect``), and lazily
loaded attributes appear only once something touched them. The same code then built a different
corpus in a Ray worker than in the driver (the tiny LM's first loss differed: 7.9477 against
7.9588 for the same seed and batch). So the texts are read here, in a child interpreter started
with ``-I -S`` (no site-packages, no environment, no script directory on ``sys.path``) that
imports nothing but the standard library: one answer per Python version.

This module imports only the standard library; it runs as a script in that child
(``python -I -S stdlib_docs.py MODULE ...`` prints ``{module: [text, ...]}`` as JSON).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import re
import subprocess
import sys

MIN_CHARS = 40
MAX_CHARS = 400
# C implementations whose objects report another module name
IMPL_MODULES = {"os": ("posix", "nt")}


def owned_by(obj: object, module: str) -> bool:
    """Whether ``obj`` is defined by ``module`` (or its C accelerator), not re-exported."""
    owner = getattr(obj, "__module__", None)
    if not isinstance(owner, str):
        return False
    if owner == module or owner.startswith(module + "."):
        return True
    if owner.lstrip("_") in (module, module.rsplit(".", 1)[-1]):
        return True
    return owner in IMPL_MODULES.get(module, ())


def first_paragraph(doc: str) -> str:
    """A docstring's first paragraph, whitespace collapsed, at most :data:`MAX_CHARS` long."""
    par = re.split(r"\n\s*\n", inspect.cleandoc(doc).strip(), maxsplit=1)[0]
    text = " ".join(par.split())
    if len(text) > MAX_CHARS:
        cut = text[:MAX_CHARS]
        space = cut.rfind(" ")
        text = cut[:space] if space > MAX_CHARS // 2 else cut
    return text


def live_module_docs(module: str) -> set[str]:
    """The texts of ``module`` read from this process's objects (what the child runs)."""
    mod = importlib.import_module(module)
    texts: set[str] = set()
    for name in sorted(vars(mod)):
        if name.startswith("_"):
            continue
        obj = vars(mod)[name]
        if inspect.ismodule(obj) or not callable(obj) or not owned_by(obj, module):
            continue
        members: list[object] = [obj]
        if inspect.isclass(obj):
            for attr, value in sorted(vars(obj).items()):
                if attr.startswith("_"):
                    continue
                if isinstance(value, staticmethod | classmethod):
                    value = value.__func__
                if isinstance(value, property) or callable(value):
                    members.append(value)
        for member in members:
            doc = getattr(member, "__doc__", None)
            if isinstance(doc, str):
                text = first_paragraph(doc)
                if len(text) >= MIN_CHARS:
                    texts.add(text)
    return texts


@functools.cache
def clean_module_docs(modules: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``{module: sorted texts}`` for ``modules``, read in a clean child interpreter (imported
    in the given order)."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", __file__, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"reading standard-library docstrings in a clean interpreter failed: "
            f"{out.stderr.strip()[-500:]}"
        )
    got = json.loads(out.stdout)
    return {m: tuple(got[m]) for m in modules}


if __name__ == "__main__":
    print(json.dumps({m: sorted(live_module_docs(m)) for m in sys.argv[1:]}))
