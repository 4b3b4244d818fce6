"""Building blocks shared by several methods."""

from .transformer import Encoder, PreLNBlock

__all__ = ["Encoder", "PreLNBlock"]
