"""nshot: train, tune and serve few-, one- and zero-shot methods on Ray.

The Python API mirrors the command line (:mod:`nshot.api`)::

    import nshot

    nshot.list_methods()                              # nshot list
    run = nshot.train("tail", "smoke")                # nshot train tail --preset smoke
    pred = nshot.load(run.checkpoint)                 # the predictor nshot serve wraps
    nshot.evaluate(run.checkpoint)                    # nshot eval tail --checkpoint ...
    nshot.tune("tail", "smoke", num_samples=4)        # nshot tune tail --preset smoke
    nshot.reproduce("caos", "smoke", out="res")       # nshot reproduce caos --preset smoke

``import nshot`` imports neither torch nor Ray: each name is imported when first used.
``nshot.train``, ``nshot.tune`` and ``nshot.reproduce`` stay the subpackages and module of
those names (``nshot.train.fit``, ``nshot.tune.SearchSpace``, ...); calling one runs the
function of :mod:`nshot.api` with its name.
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import inspect
    from typing import Any

__version__ = "0.1.0"

#: names of :mod:`nshot.api` exported here, imported on first use
_API = (
    "CheckpointError",
    "ConfigError",
    "NshotError",
    "SweepResult",
    "TrainedRun",
    "UnknownMethodError",
    "evaluate",
    "list_methods",
    "load",
    "load_checkpoint",
)
#: submodules that are also the function of :mod:`nshot.api` with their name when called
_CALLABLE = ("reproduce", "train", "tune")

__all__ = ["__version__", *_API, *_CALLABLE]


class _CallableModule(_types.ModuleType):
    """A submodule (``nshot.train``) that runs :mod:`nshot.api`'s function of its name
    (:func:`nshot.api.train`) when called; as a module it is unchanged."""

    def _api_function(self) -> Any:
        from nshot import api

        return getattr(api, self.__name__.rpartition(".")[2])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._api_function()(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:  # inspect.signature(nshot.train)
        import inspect

        return inspect.signature(self._api_function())

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # pickled by name, as modules are
        return _importlib.import_module, (self.__name__,)


class _Package(_types.ModuleType):
    """The ``nshot`` package: when the import system binds ``nshot.train`` (or ``tune``,
    ``reproduce``) on it, that submodule becomes a :class:`_CallableModule`."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (
            name in _CALLABLE
            and type(value) is _types.ModuleType
            and value.__name__ == f"{__name__}.{name}"
        ):
            value.__class__ = _CallableModule
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _importlib.import_module, (self.__name__,)


_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name in _CALLABLE:  # binds it here, through _Package.__setattr__
        return _importlib.import_module(f"{__name__}.{name}")
    if name in _API:
        if name.endswith("Error"):
            from nshot import errors as source
        else:
            from nshot import api as source
        value = getattr(source, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})
