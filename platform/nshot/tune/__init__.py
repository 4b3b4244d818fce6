"""Ray Tune glue: search spaces, the searcher registry, f/h reporting and the sweep history.

``nshot tune <method> --search {random,optuna,ax,auxbo}`` runs :func:`nshot.tune.run.tune`.
"""

from nshot.tune.history import HistoryTask, Trial, load_tasks, save_task
from nshot.tune.searchers import (
    SearchContext,
    available_searchers,
    build_searcher,
    register_searcher,
)
from nshot.tune.space import Choice, Float, Int, SearchSpace, SearchSpaceError, TuneSpec

__all__ = [
    "Choice",
    "Float",
    "HistoryTask",
    "Int",
    "SearchContext",
    "SearchSpace",
    "SearchSpaceError",
    "Trial",
    "TuneSpec",
    "available_searchers",
    "build_searcher",
    "load_tasks",
    "register_searcher",
    "save_task",
]
