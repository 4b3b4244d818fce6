"""URS: unified neural routing solver for many VRP variants, zero-shot."""

from .method import URSMethod

__all__ = ["URSMethod"]
