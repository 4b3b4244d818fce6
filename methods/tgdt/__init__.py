"""tgdt: TG-DT, a text-guided decision transformer for zero-shot offline meta-RL.

Importing the package registers the method.
"""

from .method import TGDTMethod

__all__ = ["TGDTMethod"]
