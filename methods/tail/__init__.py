"""TAIL: universal algorithm-implicit meta-learner."""

from .method import TailMethod

__all__ = ["TailMethod"]
