"""scgfm: SCGFM, a structure-centric graph foundation model with Gromov–Wasserstein
geometric bases.

Importing the package registers the method.
"""

from .method import ScgfmMethod

__all__ = ["ScgfmMethod"]
