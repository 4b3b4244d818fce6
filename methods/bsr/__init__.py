"""bsr: BSR, brain signal rendering of EEG into spectrum videos for VideoMAE.

Importing the package registers the method.
"""

from .method import BsrMethod

__all__ = ["BsrMethod"]
