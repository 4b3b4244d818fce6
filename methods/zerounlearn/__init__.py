"""ZeroUnlearn: few-shot LLM unlearning as knowledge re-mapping (spec: shared/methods/zerounlearn.md)."""

from .method import ZeroUnlearnMethod

__all__ = ["ZeroUnlearnMethod"]
