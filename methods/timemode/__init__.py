"""timemode: TimeMoDE, a diffusion transformer with a mixture of domain experts for few-shot
time-series generation.

Importing the package registers the method.
"""

from .method import TimeModeMethod

__all__ = ["TimeModeMethod"]
