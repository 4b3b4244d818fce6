"""weightspace: permutation-equivariant weight-space networks and output capacity expansion
(spec: shared/methods/weightspace.md).

Importing the package registers the method.
"""

from .method import WeightspaceMethod

__all__ = ["WeightspaceMethod"]
