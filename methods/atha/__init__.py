"""atha: ATHA, adaptive tail-head alignment for CLIP cross-domain few-shot learning.

Importing the package registers the method.
"""

from .method import AthaMethod

__all__ = ["AthaMethod"]
