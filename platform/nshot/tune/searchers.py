"""Searchers, looked up by name: ``random``, ``optuna``, ``ax`` (Ray's own) and whatever a
method registers (``auxbo``, the paper's BoTorch searcher).

A searcher factory takes a :class:`SearchContext` and returns a Ray Tune search algorithm
(a ``Searcher`` or ``SearchAlgorithm``); the platform wraps ``Searcher``s in a
``ConcurrencyLimiter``. A method adds one with::

    from nshot.tune import register_searcher
    register_searcher("mine", lambda ctx: MySearcher(ctx.space, metric=ctx.metric, mode=ctx.mode))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nshot.errors import ConfigError, NshotError
from nshot.tune.space import SearchSpace


class UnknownSearcherError(ConfigError):
    pass


@dataclass
class SearchContext:
    """What a searcher factory gets."""

    space: SearchSpace
    metric: str = "f"
    mode: str = "max"
    seed: int = 0
    max_concurrent: int = 1
    num_samples: int = 10
    method: str | None = None
    preset: str | None = None
    history_dir: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)


Factory = Callable[[SearchContext], Any]
_SEARCHERS: dict[str, Factory] = {}


def register_searcher(name: str, factory: Factory, *, replace: bool = False) -> None:
    if name in _SEARCHERS and not replace and _SEARCHERS[name] is not factory:
        raise ValueError(f"searcher {name!r} is already registered")
    _SEARCHERS[name] = factory


def available_searchers() -> list[str]:
    _discover()
    return sorted(_SEARCHERS)


def _discover() -> None:
    # methods register their searchers when imported
    from nshot.method import available

    available()


def build_searcher(name: str, ctx: SearchContext) -> Any:
    """The Tune search algorithm registered as ``name`` (concurrency-limited)."""
    from ray.tune.search import ConcurrencyLimiter, Searcher

    if name not in _SEARCHERS:
        _discover()
    if name not in _SEARCHERS:
        raise UnknownSearcherError(
            f"--search: unknown searcher {name!r}; available: {', '.join(available_searchers())}"
        )
    unknown = set(ctx.options) - _OPTIONS.get(name, set(ctx.options))
    if unknown:
        raise ConfigError(f"--search {name}: unknown searcher options {sorted(unknown)}")
    alg = _SEARCHERS[name](ctx)
    if isinstance(alg, Searcher):
        alg = ConcurrencyLimiter(alg, max_concurrent=max(1, ctx.max_concurrent))
    return alg


# options each built-in accepts (methods' searchers validate their own)
_OPTIONS: dict[str, set[str]] = {"random": set(), "optuna": set(), "ax": set()}


def _random(ctx: SearchContext) -> Any:
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(max_concurrent=max(1, ctx.max_concurrent), random_state=ctx.seed)


def _optuna(ctx: SearchContext) -> Any:
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise NshotError(
            "--search optuna needs Optuna: pip install 'nshot[tune]' (or pip install optuna)"
        ) from None
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=ctx.seed)
    return OptunaSearch(metric=ctx.metric, mode=ctx.mode, sampler=sampler)


def _ax(ctx: SearchContext) -> Any:
    try:
        import ax  # noqa: F401
    except ImportError:
        raise NshotError(
            "--search ax needs the Ax platform: pip install 'nshot[ax]' (or ax-platform>=1); "
            "--search auxbo runs BoTorch directly"
        ) from None
    from nshot.tune.ax_searcher import AxClientSearcher

    return AxClientSearcher(ctx.space, metric=ctx.metric, mode=ctx.mode, seed=ctx.seed)


register_searcher("random", _random)
register_searcher("optuna", _optuna)
register_searcher("ax", _ax)
