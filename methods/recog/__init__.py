"""recog: ReCoG, relational and compact context graph for few-shot molecular property prediction.

Importing the package registers the method.
"""

from .method import RecogMethod

__all__ = ["RecogMethod"]
