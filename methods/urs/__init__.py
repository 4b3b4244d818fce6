"""URS: unified neural routing solver for many VRP variants, zero-shot (spec: shared/methods/urs.md)."""

from .method import URSMethod

__all__ = ["URSMethod"]
