"""iclft: fine-tuning versus in-context learning in linear attention (see README.md)."""

from .method import ICLFTMethod

__all__ = ["ICLFTMethod"]
