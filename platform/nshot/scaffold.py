"""``nshot new NAME``: a new method package, written from the template.

The template (``nshot/templates/method/``) is a complete, working method named ``skeleton``: a
prototypical-network few-shot classifier on a tiny generated dataset, with the files every
method has (``docs/adding-a-method.md`` walks through them). :func:`new_method` copies it with
``skeleton`` replaced by NAME and ``Skeleton`` by NAME in CamelCase (``my_method``:
``MyMethodConfig``, ``MyMethodMethod``, ...). The copy passes the conformance checks as
written; filling it in means replacing the data, the model and the claims with the paper's.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from nshot.errors import NshotError

TEMPLATE = Path(__file__).parent / "templates" / "method"
#: the files of a method package, in the order the docs describe them
FILES = (
    "__init__.py",
    "config.py",
    "data.py",
    "model.py",
    "train.py",
    "serve.py",
    "experiments.py",
    "claims.py",
    "method.py",
    "README.md",
)
PLACEHOLDER = "skeleton"
#: the longest name: the template's lines stay within ruff's 100 columns with it
MAX_NAME = 30


def camel(name: str) -> str:
    """``my_method`` -> ``MyMethod`` (the prefix of the package's class names)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def check_name(name: str, taken: list[str] | None = None) -> None:
    """``name`` can name a method package: a lowercase Python identifier of at most
    :data:`MAX_NAME` characters that is not a keyword and not the name of a registered method
    (``taken``)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise NshotError(
            f"nshot new {name!r}: a method's name is its package's name: a lowercase Python "
            "identifier (letters, digits, underscores; a letter first), e.g. my_method"
        )
    if len(name) > MAX_NAME:
        raise NshotError(f"nshot new {name}: a method's name has at most {MAX_NAME} characters")
    if name in (taken or []):
        raise NshotError(f"nshot new {name}: a method named {name!r} is already registered")


def render(text: str, name: str) -> str:
    """A template file's text for the method ``name``."""
    text = re.sub(rf"\b{PLACEHOLDER.capitalize()}", camel(name), text)
    return re.sub(rf"\b{PLACEHOLDER}\b", name, text)


def new_method(name: str, parent: str | Path, taken: list[str] | None = None) -> Path:
    """Write the package ``parent/name/`` from the template and return its path; nothing is
    written when ``name`` is refused or the folder exists."""
    check_name(name, taken)
    parent = Path(parent).expanduser()
    dest = parent / name
    if dest.exists():
        raise NshotError(f"nshot new {name}: {dest} already exists; choose another name or --dir")
    if parent.exists() and not parent.is_dir():
        raise NshotError(f"--dir {parent}: not a directory")
    texts = {f: render((TEMPLATE / f).read_text(), name) for f in FILES}
    dest.mkdir(parents=True)
    for f, text in texts.items():
        (dest / f).write_text(text)
    return dest


def default_parent(cwd: Path | None = None) -> Path:
    """Where ``nshot new`` writes without ``--dir``: ``./methods`` in an nshot checkout (its
    packages are the built-in methods), else the current folder."""
    cwd = cwd or Path.cwd()
    methods = cwd / "methods"
    if (methods / "__init__.py").is_file() and (cwd / "platform" / "nshot").is_dir():
        return methods
    return cwd
