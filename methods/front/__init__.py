"""front: FRONT, frequency-domain knowledge transfer with a DCT learngene (spec:
shared/methods/front.md).

Importing the package registers the method.
"""

from .method import FrontMethod

__all__ = ["FrontMethod"]
