"""front: FRONT, frequency-domain knowledge transfer with a DCT learngene.

Importing the package registers the method.
"""

from .method import FrontMethod

__all__ = ["FrontMethod"]
