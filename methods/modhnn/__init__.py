"""modhnn: modulation-based meta-learning of Hamiltonian dynamics (spec: shared/methods/modhnn.md).

Importing the package registers the method.
"""

from .method import ModHNNMethod

__all__ = ["ModHNNMethod"]
