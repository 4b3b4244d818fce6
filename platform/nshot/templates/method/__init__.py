"""skeleton: a prototypical-network few-shot classifier (the template of ``nshot new``).

Importing the package registers the method (``method.py``); ``nshot list`` then shows it.
"""

from .method import SkeletonMethod

__all__ = ["SkeletonMethod"]
