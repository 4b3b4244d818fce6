"""TAIL: universal algorithm-implicit meta-learner (spec: shared/methods/tail.md)."""

from .method import TailMethod

__all__ = ["TailMethod"]
