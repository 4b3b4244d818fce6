"""auxbo: few-shot Bayesian optimisation with auxiliary information.

Importing the package registers the method and the ``auxbo`` Tune searcher.
"""

from nshot.tune.searchers import register_searcher

from .method import AuxBOMethod
from .searcher import AuxBOSearcher, searcher_factory

register_searcher("auxbo", searcher_factory, replace=True)

__all__ = ["AuxBOMethod", "AuxBOSearcher"]
