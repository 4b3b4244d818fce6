"""dirclip's predictor: zero-shot classification of images under a label set chosen per
request, with UCAT's Dirichlet uncertainty per answer, by the fine-tuned image tower g of the
checkpoint's backbone.

The request's form is the backbone's input domain (``Request``, chosen by the checkpoint's
``backbone``):

* the tiny CLIP on digits (:class:`DirclipRequest`): images of 64 floats in [0, 1] each (an
  8 × 8 grey digit row by row) or base64 PNGs of 8 × 8 grey images; the word text tower knows
  the ten digit names only, so class names come from them (2 to 10 of them; the error lists
  them);
* a real CLIP (``paper``, :class:`DirclipImageRequest`): ``H × W × 3`` arrays of floats in
  [0, 1] or base64 PNG / JPEG images (RGB or grey; each side 1 to 1,024), given CLIP's
  preprocessing (the shorter side resized bicubic to the model's resolution, the centre crop);
  an array is first rounded to 8 bits, as an image file would be, so an array and its PNG get
  the same answer; class names are any 2 to 1,000 unique non-empty texts (CLIP's byte-level BPE
  knows every word).

Both give class names, a prompt template with ``{}`` once and ``return_uncertainty``. The
predictor is one: g's image tower runs in float64 on the predictor's device, so an image's
answer does not depend on which images share its forward pass (float32 matrix products differ
in the last bits between batch sizes, and the logits' scale of 100 amplifies them), and all
images of a request (and of a batch of requests) go through it in one forward pass.

A ``paper`` checkpoint holds g's selected weights and records the CLIP they were tuned from;
the predictor reads that CLIP from the recorded ``clip_path`` (the serving machine must have it
there; the error names ``clip_path`` otherwise), checks its parameter fingerprint and puts g's
weights in (:func:`.model.load_model`). Nothing is downloaded; nothing is unpickled.

For ``nshot serve dirclip --conformal caos`` a request may add a labelled support set
(``support_images``, in the images' form, or for a real CLIP ``support_images_b64``, with
``support_labels`` among ``class_names``): the conformal wrapper calibrates on it, with g's unit
image features as the frozen embedding.
"""

from __future__ import annotations

import base64
import io
import math
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field, PrivateAttr, model_validator

from nshot.method import Predictor
from nshot.serve.images import check_rgb_array, decode_base64_image
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .config import TEMPLATE
from .data import DIGIT_NAMES
from .dirichlet import uncertainty
from .model import DirClip, load_model

MAX_CLASSES = 1000
SIDE = 8
MAX_SIDE = 1024
MAX_NAME = 200


def _check_pixels(rows: list[list[float]], field: str) -> None:
    for i, im in enumerate(rows):
        if len(im) != SIDE * SIDE:
            raise ValueError(
                f"{field}[{i}]: {len(im)} values; an image is {SIDE * SIDE} floats "
                f"({SIDE}×{SIDE} grey, row by row)"
            )
        for v in im:
            if not math.isfinite(v):
                raise ValueError(f"{field}[{i}]: contains NaN or inf")
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{field}[{i}]: value {v} is outside [0, 1]")


def decode_png(data: str, field: str) -> list[float]:
    """A base64 PNG (or JPEG) of an 8 × 8 image → 64 grey values in [0, 1].

    The side is checked from the header before any pixel is decoded (a small file may claim
    a huge image), through the platform's decoder.
    """
    from PIL import Image

    rgb = decode_base64_image(data, field, formats=("PNG", "JPEG"), max_side=SIDE)
    if rgb.shape[:2] != (SIDE, SIDE):
        raise ValueError(f"{field}: image is {rgb.shape[1]}×{rgb.shape[0]}, not {SIDE}×{SIDE}")
    grey = np.asarray(Image.fromarray(rgb).convert("L"), dtype=np.float64) / 255.0
    return grey.reshape(-1).tolist()


def encode_png(pixels: list[float]) -> str:
    """64 grey values in [0, 1] → a base64 PNG (for clients and tests)."""
    from PIL import Image

    arr = np.clip(np.round(np.asarray(pixels) * 255), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr.reshape(SIDE, SIDE), mode="L").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _round(v: float | torch.Tensor) -> float:
    """Six significant digits (the float64 tower's last bits may still depend on the batch)."""
    return float(f"{float(v):.6g}")


class LabelSet(StrictRequest):
    """What a request gives besides its images: the label set, the prompt template, whether
    to return the uncertainty; and the checks of the label set and of a support set's labels
    (``support_labels``, declared by each form with its own limit)."""

    class_names: list[str] = Field(..., description="the label set (2 to 1,000 unique names)")
    template: str = Field(TEMPLATE, description="prompt with {} for the class name")
    return_uncertainty: bool = True

    def _check_label_set(self, problem: Callable[[str], str | None]) -> None:
        """The names (2 to ``MAX_CLASSES``, each without a ``problem``, unique) and the
        template (``{}`` once)."""
        names = self.class_names
        if not 2 <= len(names) <= MAX_CLASSES:
            raise ValueError(f"class_names: give 2 to {MAX_CLASSES} names, got {len(names)}")
        for i, n in enumerate(names):
            if (why := problem(n)) is not None:
                raise ValueError(f"class_names[{i}]: {why}")
        dup = sorted(n for n, c in Counter(names).items() if c > 1)
        if dup:
            raise ValueError(f"class_names: names must be unique; repeated: {dup[:5]}")
        if self.template.count("{}") != 1:
            raise ValueError("template: must contain '{}' exactly once, for the class name")

    def _check_support_labels(self, labels: list[str], n_support: int) -> None:
        if len(labels) != n_support:
            raise ValueError(f"support_labels: {len(labels)} labels for {n_support} support images")
        for i, lab in enumerate(labels):
            if lab not in self.class_names:
                raise ValueError(f"support_labels[{i}]: {lab[:80]!r} is not in class_names")


def _digit_name_problem(name: str) -> str | None:
    if name in DIGIT_NAMES:
        return None
    return (f"{name[:80]!r} is not a name this model's text tower knows; known names: "
            f"{', '.join(DIGIT_NAMES)}")  # fmt: skip


def _name_problem(name: str) -> str | None:
    if not name.strip():
        return "empty"
    return f"longer than {MAX_NAME} characters" if len(name) > MAX_NAME else None


class DirclipRequest(LabelSet):
    """A request to the tiny CLIP on digits."""

    MAX_IMAGES: ClassVar[int] = 1024

    images: list[list[float]] | None = Field(
        None, max_length=1024, description="8×8 grey images, 64 floats in [0, 1] each"
    )
    images_b64: list[str] | None = Field(
        None, max_length=1024, description="8×8 images as base64 PNG (or JPEG)"
    )
    support_images: list[list[float]] | None = Field(
        None, max_length=1024, description="labelled images for --conformal caos"
    )
    support_labels: list[str] | None = Field(
        None, max_length=1024, description="their class names (among class_names)"
    )

    @model_validator(mode="after")
    def _check(self) -> DirclipRequest:
        if (self.images is None) == (self.images_b64 is None):
            raise ValueError("images: give exactly one of images and images_b64")
        if self.images is not None:
            if not self.images:
                raise ValueError("images: at least one image is needed")
            _check_pixels(self.images, "images")
        else:
            if not self.images_b64:
                raise ValueError("images_b64: at least one image is needed")
            for i, s in enumerate(self.images_b64):
                decode_png(s, f"images_b64[{i}]")
        self._check_label_set(_digit_name_problem)
        if (self.support_images is None) != (self.support_labels is None):
            raise ValueError("support_labels: give support_images and support_labels together")
        if self.support_images is not None:
            _check_pixels(self.support_images, "support_images")
            self._check_support_labels(self.support_labels or [], len(self.support_images))
        return self

    def pixels(self) -> list[list[float]]:
        if self.images is not None:
            return self.images
        return [decode_png(s, f"images_b64[{i}]") for i, s in enumerate(self.images_b64 or [])]

    def inputs(self, model: DirClip) -> torch.Tensor:
        """The query images, ``float64 [n, 1, 8, 8]``."""
        return _digits(self.pixels())

    def support_inputs(self, model: DirClip) -> torch.Tensor:
        """The labelled support images (none: an empty tensor)."""
        return _digits(self.support_images or [])

    @staticmethod
    def describe(model: DirClip, extra: dict[str, Any]) -> dict[str, Any]:
        return {"class_names": list(DIGIT_NAMES), "image_values": SIDE * SIDE}

    @staticmethod
    def example(model: DirClip) -> dict[str, Any]:
        """Two test-like strokes: a vertical bar ("one"?) and a ring ("zero"?), 4 classes."""
        bar = [1.0 if c in (3, 4) and 1 <= r <= 6 else 0.0 for r in range(8) for c in range(8)]
        ring = [
            1.0 if (r in (1, 6) and 2 <= c <= 5) or (c in (2, 5) and 1 <= r <= 6) else 0.0
            for r in range(8)
            for c in range(8)
        ]
        return {"images": [bar, ring], "class_names": ["zero", "one", "seven", "eight"]}


def _digits(pixels: list[list[float]]) -> torch.Tensor:
    return torch.tensor(pixels, dtype=torch.float64).view(-1, 1, SIDE, SIDE)


def decode_image_b64(data: str, field: str) -> np.ndarray:
    """A base64 PNG or JPEG (any mode, each side 1 to ``MAX_SIDE``) → ``uint8 [H, W, 3]``."""
    return decode_base64_image(data, field, formats=("PNG", "JPEG"), max_side=MAX_SIDE)


def check_array(image: list[list[list[float]]], field: str) -> np.ndarray:
    """An ``H × W × 3`` nested list of floats in [0, 1] → ``uint8 [H, W, 3]`` (rounded)."""
    return check_rgb_array(image, field, scale=1, max_side=MAX_SIDE)


class DirclipImageRequest(LabelSet):
    """A request to a real CLIP (``paper``)."""

    MAX_IMAGES: ClassVar[int] = 256

    images: list[list[list[list[float]]]] | None = Field(
        None, max_length=256, description="H × W × 3 arrays of floats in [0, 1]"
    )
    images_b64: list[str] | None = Field(
        None, max_length=256, description="base64 PNG or JPEG images"
    )
    support_images: list[list[list[list[float]]]] | None = Field(
        None, max_length=256, description="labelled images for --conformal caos (arrays)"
    )
    support_images_b64: list[str] | None = Field(
        None, max_length=256, description="labelled images for --conformal caos (base64)"
    )
    support_labels: list[str] | None = Field(
        None, max_length=256, description="their class names (among class_names)"
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
    def _check(self) -> DirclipImageRequest:
        if (self.images is None) == (self.images_b64 is None):
            raise ValueError("images: give exactly one of images and images_b64")
        queries = self._decode(self.images, self.images_b64, "images")
        if not queries:
            field = "images" if self.images is not None else "images_b64"
            raise ValueError(f"{field}: at least one image is needed")
        self._check_label_set(_name_problem)
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
        self._check_support_labels(self.support_labels or [], len(support))
        return support

    def arrays(self) -> list[np.ndarray]:
        """The query images as ``uint8 [H, W, 3]``."""
        assert self._decoded is not None  # set by the validator
        return self._decoded[0]

    def support_arrays(self) -> list[np.ndarray]:
        """The labelled support images as ``uint8 [H, W, 3]`` (none when there is no support)."""
        assert self._decoded is not None  # set by the validator
        return self._decoded[1]

    def inputs(self, model: DirClip) -> torch.Tensor:
        """The query images after the backbone's preprocessing, ``float64 [n, 3, S, S]``."""
        return _preprocessed(model, self.arrays())

    def support_inputs(self, model: DirClip) -> torch.Tensor:
        return _preprocessed(model, self.support_arrays())

    @staticmethod
    def describe(model: DirClip, extra: dict[str, Any]) -> dict[str, Any]:
        rec = extra.get("model", {})
        return {"backbone": "clip", "clip_path": rec.get("clip_path"),
                "clip_arch": rec.get("clip_arch"), "image_size": model.backbone.image_size}  # fmt: skip

    @staticmethod
    def example(model: DirClip) -> dict[str, Any]:
        """Two small arrays (a bright and a dark square) and two of the training classes."""
        bright = [[[0.9, 0.8, 0.7]] * 8 for _ in range(8)]
        dark = [[[0.1, 0.2, 0.1]] * 8 for _ in range(8)]
        return {"images": [bright, dark], "class_names": list(model.class_names[:2])}


def _preprocessed(model: DirClip, arrays: list[np.ndarray]) -> torch.Tensor:
    if not arrays:
        return torch.zeros(0, 3, model.backbone.image_size, model.backbone.image_size)
    return torch.from_numpy(np.stack([model.backbone.preprocess(a) for a in arrays])).double()


class Uncertainty(BaseModel):
    entropy: float = Field(..., description="softmax entropy (nats)")
    au: float = Field(..., description="aleatoric: expected entropy under the Dirichlet ÷ ln C")
    eu: float = Field(..., description="epistemic (paper): C / (α₀ + C)")
    eu_code: float = Field(..., description="epistemic (released code): C / logsumexp(α+1) / ln C")
    alpha0: float = Field(..., description="Dirichlet strength α₀ (evaluation α)")


class Prediction(BaseModel):
    label: str
    probs: dict[str, float]
    uncertainty: Uncertainty | None = None


class DirclipResponse(BaseModel):
    predictions: list[Prediction]


#: the request form of each backbone (the config's ``backbone``)
REQUESTS: dict[str, type[DirclipRequest] | type[DirclipImageRequest]] = {
    "tinyclip": DirclipRequest,
    "clip": DirclipImageRequest,
}


class DirclipPredictor(Predictor[Any, DirclipResponse]):
    Request = DirclipRequest
    Response = DirclipResponse

    def __init__(self, model: DirClip, cfg, extra: dict[str, Any]) -> None:
        from nshot.train.trainer import local_device

        self.Request = REQUESTS[cfg.backbone]  # type: ignore[misc]
        self.device = local_device()
        self.model = model.to(self.device).eval()
        # g in float64: an image's answer does not depend on which images share its forward
        # pass (see the module docstring)
        model.backbone.cast_image_tower(torch.float64)
        self.cfg = cfg
        self.extra = extra
        self._text: dict[tuple[tuple[str, ...], str], torch.Tensor] = {}

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> DirclipPredictor:
        model, cfg, extra = load_model(checkpoint)
        return cls(model, cfg, extra)

    def metadata(self) -> dict[str, Any]:
        return {
            "loss": self.extra.get("loss"),
            "lambda": self.extra.get("lambda"),
            "selected": self.extra.get("selected"),
            **self.Request.describe(self.model, self.extra),
            "max_images": self.Request.MAX_IMAGES,
            "template": TEMPLATE,
        }

    def example_request(self) -> dict[str, Any]:
        return self.Request.example(self.model)

    def _text_features(self, names: list[str], template: str) -> torch.Tensor:
        key = (tuple(names), template)
        if key not in self._text:
            if len(self._text) > 256:
                self._text.clear()
            self._text[key] = self.model.text_features_of(names, template).double()
        return self._text[key]

    @torch.no_grad()
    def _features(self, x: torch.Tensor) -> torch.Tensor:
        """g's unit image features (float64, on the predictor's device)."""
        return F.normalize(self.model.features(x.to(self.device, torch.float64)), dim=-1)

    def _answer(self, request: Any, feats: torch.Tensor) -> DirclipResponse:
        names = request.class_names
        logits = self.model.scale * feats @ self._text_features(names, request.template).T
        return response_from_logits(names, logits.cpu(), request.return_uncertainty)

    def __call__(self, request: Any) -> DirclipResponse:
        return self.batch([request])[0]

    def batch(self, requests: list[Any]) -> list[DirclipResponse]:
        """Every image of every request through the image tower in one forward pass."""
        inputs = [r.inputs(self.model) for r in requests]
        parts = self._features(torch.cat(inputs)).split([len(x) for x in inputs])
        return [self._answer(r, f) for r, f in zip(requests, parts, strict=True)]

    @torch.no_grad()
    def one_shot_embeddings(self, request: Any, kind: str | None = None):
        """Frozen per-image features for conformal prediction sets: g's unit image features
        of the labelled support images and of the query images (one image each, no label)."""
        from nshot.serve.conformal import OneShotEpisode

        support = request.support_inputs(self.model)
        if not len(support):
            raise ValueError("support_images: conformal sets need a labelled support set")
        names = request.class_names
        index = {n: i for i, n in enumerate(names)}
        f = self._features(torch.cat([support, request.inputs(self.model)])).cpu().numpy()
        n = len(support)
        return OneShotEpisode(
            support_emb=f[:n],
            support_labels=np.array([index[lab] for lab in request.support_labels or []]),
            query_emb=f[n:],
            classes=list(names),
            support_field="support_images",
        )


def response_from_logits(
    names: list[str], logits: torch.Tensor, with_uncertainty: bool
) -> DirclipResponse:
    """One answer per row of ``logits`` (images × classes): the label, the probabilities and,
    when asked, the Dirichlet uncertainty (AU/EU) of the concentrations the logits define."""
    probs = logits.softmax(-1)
    u = uncertainty(logits) if with_uncertainty else None
    preds = []
    for i in range(len(logits)):
        unc = None
        if u is not None:
            unc = Uncertainty(**{k: _round(u[k][i]) for k in Uncertainty.model_fields})
        preds.append(
            Prediction(
                label=names[int(probs[i].argmax())],
                probs={n: _round(p) for n, p in zip(names, probs[i].tolist(), strict=True)},
                uncertainty=unc,
            )
        )
    return DirclipResponse(predictions=preds)
