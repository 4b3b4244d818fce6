"""unpaired_iv: causal effects from unpaired data across many environments (SplitUP;
arXiv 2601.15254)."""

from .method import UnpairedIVMethod

__all__ = ["UnpairedIVMethod"]
