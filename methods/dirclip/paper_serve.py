"""dirclip's predictor on a ``paper`` checkpoint (``backbone='clip'``): zero-shot classification
by the adversarially fine-tuned image tower g of a real CLIP, with UCAT's Dirichlet
uncertainty per answer (the toy predictor's answer, :mod:`.serve`).

The checkpoint holds g's selected weights and records the CLIP they were tuned from; the
predictor reads that CLIP from the recorded ``clip_path`` (the serving machine must have it
there; the error names ``clip_path`` otherwise), checks its parameter fingerprint and puts g's
weights in (:func:`.paper.load_paper_model`). Nothing is downloaded; nothing is unpickled.

A request gives images (base64 PNG or JPEG, RGB or grey, or ``H × W × 3`` arrays of floats in
[0, 1]; each side 1 to 1,024), class names (2 to 1,000 unique, non-empty, any text: CLIP's
byte-level BPE knows every word), a prompt template with ``{}`` once, and
``return_uncertainty``. Images get CLIP's preprocessing (the shorter side resized bicubic to
the model's resolution, the centre crop); an array is first rounded to 8 bits, as an image file
would be, so an array and its PNG get the same answer. A request's images go through g in one
forward pass (requests are not batched together: an answer does not depend on other requests).

For ``nshot serve dirclip --conformal caos`` a request may add a labelled support set
(``support_images`` or ``support_images_b64``, in the images' forms, with ``support_labels``
among ``class_names``): the conformal wrapper calibrates on it, with g's unit image features as
the frozen embedding, as the toy predictor does.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, PrivateAttr, model_validator

from nshot.method import Predictor
from nshot.serve.images import check_rgb_array, decode_base64_image
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .config import TEMPLATE
from .model import SCALE
from .paper import HFDirClip, load_paper_model
from .serve import DirclipResponse, response_from_logits

MAX_IMAGES = 256
MAX_CLASSES = 1000
MAX_SIDE = 1024
MAX_NAME = 200


def decode_image_b64(data: str, field: str) -> np.ndarray:
    """A base64 PNG or JPEG (any mode, each side 1 to ``MAX_SIDE``) → ``uint8 [H, W, 3]``."""
    return decode_base64_image(data, field, formats=("PNG", "JPEG"), max_side=MAX_SIDE)


def check_array(image: list[list[list[float]]], field: str) -> np.ndarray:
    """An ``H × W × 3`` nested list of floats in [0, 1] → ``uint8 [H, W, 3]`` (rounded)."""
    return check_rgb_array(image, field, scale=1, max_side=MAX_SIDE)


class DirclipPaperRequest(StrictRequest):
    images: list[list[list[list[float]]]] | None = Field(
        None, max_length=MAX_IMAGES, description="H × W × 3 arrays of floats in [0, 1]"
    )
    images_b64: list[str] | None = Field(
        None, max_length=MAX_IMAGES, description="base64 PNG or JPEG images"
    )
    class_names: list[str] = Field(..., description="the label set (2 to 1,000 unique names)")
    template: str = Field(TEMPLATE, description="prompt with {} for the class name")
    return_uncertainty: bool = True
    support_images: list[list[list[list[float]]]] | None = Field(
        None, max_length=MAX_IMAGES, description="labelled images for --conformal caos (arrays)"
    )
    support_images_b64: list[str] | None = Field(
        None, max_length=MAX_IMAGES, description="labelled images for --conformal caos (base64)"
    )
    support_labels: list[str] | None = Field(
        None, max_length=MAX_IMAGES, description="their class names (among class_names)"
    )

    # the decoded query and support images (uint8 [H, W, 3]), set once by the validator
    _decoded: tuple[list[np.ndarray], list[np.ndarray]] | None = PrivateAttr(None)

    @staticmethod
    def _decode(arrays: list | None, b64: list[str] | None, field: str) -> list[np.ndarray]:
        """``field``'s arrays, or ``field``_b64's images, as ``uint8 [H, W, 3]``."""
        if arrays is not None:
            return [check_array(im, f"{field}[{i}]") for i, im in enumerate(arrays)]
        return [decode_image_b64(s, f"{field}_b64[{i}]") for i, s in enumerate(b64 or [])]

    @model_validator(mode="after")
    def _check(self) -> DirclipPaperRequest:
        if (self.images is None) == (self.images_b64 is None):
            raise ValueError("images: give exactly one of images and images_b64")
        queries = self._decode(self.images, self.images_b64, "images")
        if not queries:
            field = "images" if self.images is not None else "images_b64"
            raise ValueError(f"{field}: at least one image is needed")
        names = self.class_names
        if not 2 <= len(names) <= MAX_CLASSES:
            raise ValueError(f"class_names: give 2 to {MAX_CLASSES} names, got {len(names)}")
        for i, n in enumerate(names):
            if not n.strip():
                raise ValueError(f"class_names[{i}]: empty")
            if len(n) > MAX_NAME:
                raise ValueError(f"class_names[{i}]: longer than {MAX_NAME} characters")
        dup = sorted(n for n, c in Counter(names).items() if c > 1)
        if dup:
            raise ValueError(f"class_names: names must be unique; repeated: {dup[:5]}")
        if self.template.count("{}") != 1:
            raise ValueError("template: must contain '{}' exactly once, for the class name")
        self._decoded = (queries, self._checked_support())
        return self

    def _checked_support(self) -> list[np.ndarray]:
        given = self.support_images is not None or self.support_images_b64 is not None
        if self.support_images is not None and self.support_images_b64 is not None:
            raise ValueError("support_images: give one of support_images and support_images_b64")
        if given != (self.support_labels is not None):
            raise ValueError("support_labels: give the support images and their labels together")
        if not given:
            return []
        support = self._decode(self.support_images, self.support_images_b64, "support_images")
        if len(self.support_labels) != len(support):
            raise ValueError(
                f"support_labels: {len(self.support_labels)} labels for {len(support)} images"
            )
        for i, lab in enumerate(self.support_labels):
            if lab not in self.class_names:
                raise ValueError(f"support_labels[{i}]: {lab[:80]!r} is not in class_names")
        return support

    def arrays(self) -> list[np.ndarray]:
        """The query images as ``uint8 [H, W, 3]``."""
        assert self._decoded is not None  # set by the validator
        return self._decoded[0]

    def support_arrays(self) -> list[np.ndarray]:
        """The labelled support images as ``uint8 [H, W, 3]`` (none when there is no support)."""
        assert self._decoded is not None  # set by the validator
        return self._decoded[1]


class DirclipPaperPredictor(Predictor[DirclipPaperRequest, DirclipResponse]):
    Request = DirclipPaperRequest
    Response = DirclipResponse

    def __init__(self, model: HFDirClip, cfg, extra: dict[str, Any]) -> None:
        from nshot.train.trainer import local_device

        device = local_device()
        self.model = model.to(device).eval()
        self.device = device
        self.cfg = cfg
        self.extra = extra
        self._text: dict[tuple[tuple[str, ...], str], torch.Tensor] = {}

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> DirclipPaperPredictor:
        model, cfg, extra = load_paper_model(checkpoint)
        return cls(model, cfg, extra)

    @property
    def image_size(self) -> int:
        return int(self.model.pre.image_size)

    def metadata(self) -> dict[str, Any]:
        rec = self.extra.get("model", {})
        return {
            "backbone": "clip",
            "clip_path": rec.get("clip_path"),
            "clip_arch": rec.get("clip_arch"),
            "loss": self.extra.get("loss"),
            "lambda": self.extra.get("lambda"),
            "selected": self.extra.get("selected"),
            "image_size": self.image_size,
            "max_images": MAX_IMAGES,
            "template": TEMPLATE,
        }

    def example_request(self) -> dict[str, Any]:
        """Two small arrays (a bright and a dark square) and two of the training classes."""
        names = list(self.model.class_names[:2])
        bright = [[[0.9, 0.8, 0.7]] * 8 for _ in range(8)]
        dark = [[[0.1, 0.2, 0.1]] * 8 for _ in range(8)]
        return {"images": [bright, dark], "class_names": names}

    def pixels(self, request: DirclipPaperRequest) -> torch.Tensor:
        """The request's images after CLIP's preprocessing, ``float32 [n, 3, S, S]``."""
        return self._preprocess(request.arrays())

    def _preprocess(self, arrays: list[np.ndarray]) -> torch.Tensor:
        from nshot.nn.hfclip import preprocess_image

        return torch.from_numpy(np.stack([preprocess_image(a, self.image_size) for a in arrays]))

    @torch.no_grad()
    def one_shot_embeddings(self, request: DirclipPaperRequest, kind: str | None = None):
        """Frozen per-image features for conformal prediction sets: g's unit image features
        of the labelled support images and of the query images (one image each, no label)."""
        from nshot.serve.conformal import OneShotEpisode

        support = request.support_arrays()
        if not support:
            raise ValueError("support_images: conformal sets need a labelled support set")
        x = self._preprocess(support + request.arrays()).to(self.device)
        f = F.normalize(self.model.features(x), dim=-1).double().cpu().numpy()
        index = {n: i for i, n in enumerate(request.class_names)}
        n = len(support)
        return OneShotEpisode(
            support_emb=f[:n],
            support_labels=np.array([index[lab] for lab in request.support_labels or []]),
            query_emb=f[n:],
            classes=list(request.class_names),
            support_field="support_images",
        )

    def _text_features(self, names: list[str], template: str) -> torch.Tensor:
        key = (tuple(names), template)
        if key not in self._text:
            if len(self._text) > 256:
                self._text.clear()
            self._text[key] = self.model.text_features_of(names, template)
        return self._text[key]

    @torch.no_grad()
    def logits(self, request: DirclipPaperRequest) -> torch.Tensor:
        """``s · cos`` of g's features against the request's prompts, float64 on the CPU."""
        x = self.pixels(request).to(self.device)
        img = F.normalize(self.model.features(x), dim=-1)
        text = self._text_features(request.class_names, request.template)
        return (SCALE * img @ text.T).double().cpu()

    def __call__(self, request: DirclipPaperRequest) -> DirclipResponse:
        names = request.class_names
        return response_from_logits(names, self.logits(request), request.return_uncertainty)
