"""skeleton: a prototypical-network few-shot classifier (``nshot new``'s template).

Importing the package registers the method (``method.py``); ``nshot list`` then shows it.
"""

from .method import SkeletonMethod

__all__ = ["SkeletonMethod"]
