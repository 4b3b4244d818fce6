"""dirclip: UCAT, Dirichlet adversarial fine-tuning of CLIP for calibrated robustness.

Importing the package registers the method.
"""

from .method import DirclipMethod

__all__ = ["DirclipMethod"]
