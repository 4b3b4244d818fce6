"""iclft: fine-tuning versus in-context learning in linear attention
(spec: shared/methods/iclft.md)."""

from .method import ICLFTMethod

__all__ = ["ICLFTMethod"]
