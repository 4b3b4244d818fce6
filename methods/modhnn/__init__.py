"""modhnn: modulation-based meta-learning of Hamiltonian dynamics (see README.md).

Importing the package registers the method.
"""

from .method import ModHNNMethod

__all__ = ["ModHNNMethod"]
