"""caos: conformal aggregation of one-shot predictors (spec: shared/methods/caos.md)."""

from .method import CAOSMethod

__all__ = ["CAOSMethod"]
