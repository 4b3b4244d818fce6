"""weightspace: permutation-equivariant weight-space networks and output capacity expansion
(see README.md).

Importing the package registers the method.
"""

from .method import WeightspaceMethod

__all__ = ["WeightspaceMethod"]
