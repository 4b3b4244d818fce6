"""ZeroUnlearn: few-shot LLM unlearning as knowledge re-mapping."""

from .method import ZeroUnlearnMethod

__all__ = ["ZeroUnlearnMethod"]
