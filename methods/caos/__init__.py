"""caos: conformal aggregation of one-shot predictors (arXiv 2601.05219)."""

from .method import CAOSMethod

__all__ = ["CAOSMethod"]
