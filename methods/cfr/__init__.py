"""cfr: CFR, a crossmodal feature replacer for RGB + 3D few-shot anomaly detection.

Importing the package registers the method.
"""

from .method import CfrMethod

__all__ = ["CfrMethod"]
