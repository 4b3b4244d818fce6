"""unpaired_iv: causal effects from unpaired data across many environments (SplitUP; spec:
shared/methods/unpaired_iv.md)."""

from .method import UnpairedIVMethod

__all__ = ["UnpairedIVMethod"]
