"""Images in request bodies: base64 PNG/JPEG strings and ``H × W × 3`` nested arrays.

Predictors that take images (atha, dirclip) check them with these two functions inside their
strict request models, so a bad image is a ``ValueError`` whose message starts with the field's
path (the Serve app turns it into a 422 naming that field). Both return ``uint8 [H, W, 3]``.
Nothing is unpickled: PIL decodes only the formats named.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Sequence

import numpy as np

MAX_SIDE = 1024


def decode_base64_image(
    data: str,
    field: str,
    *,
    formats: Sequence[str] = ("PNG",),
    rgb_only: bool = False,
    max_side: int = MAX_SIDE,
) -> np.ndarray:
    """A base64 image of one of ``formats`` (each side ≤ ``max_side``) → ``uint8 [H, W, 3]``.

    ``rgb_only``: refuse any other mode (grey, RGBA, palette) instead of converting it to RGB.
    """
    from PIL import Image, UnidentifiedImageError

    names = " or ".join(formats)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{field}: not valid base64") from None
    try:
        with Image.open(io.BytesIO(raw)) as img:
            if img.format not in formats:
                raise ValueError(f"{field}: a {img.format} image; send {names}")
            if max(img.size) > max_side:
                raise ValueError(f"{field}: {img.size[0]}×{img.size[1]} exceeds {max_side} a side")
            if rgb_only and img.mode != "RGB":
                raise ValueError(
                    f"{field}: {len(img.getbands())} channel(s) ({img.mode}); expected RGB"
                )
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except ValueError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError):
        raise ValueError(f"{field}: not a decodable {names} image") from None


def check_rgb_array(
    image: Sequence[Sequence[Sequence[float]]],
    field: str,
    *,
    scale: int = 255,
    max_side: int = MAX_SIDE,
) -> np.ndarray:
    """An ``H × W × 3`` nested list with values in ``[0, scale]`` → ``uint8 [H, W, 3]``.

    ``scale`` is 255 (8-bit values, taken as they are) or 1 (floats in [0, 1], rounded to 8 bits
    as an image file would hold them, so an array and its PNG give the same pixels).
    """
    if scale not in (1, 255):
        raise ValueError(f"scale must be 1 or 255, got {scale}")
    h = len(image)
    if not 1 <= h <= max_side:
        raise ValueError(f"{field}: height {h} is outside [1, {max_side}]")
    w = len(image[0])
    if not 1 <= w <= max_side:
        raise ValueError(f"{field}: width {w} is outside [1, {max_side}]")
    for r, row in enumerate(image):
        if len(row) != w:
            raise ValueError(f"{field}: row {r} has {len(row)} pixels, row 0 has {w}")
        for px in row:
            if len(px) != 3:
                raise ValueError(f"{field}: a pixel has {len(px)} values; expected 3 (RGB)")
            for v in px:
                if not math.isfinite(v):
                    raise ValueError(f"{field}: contains NaN or inf")
                if not 0 <= v <= scale:
                    raise ValueError(f"{field}: value {v} is outside [0, {scale}]")
    arr = np.asarray(image, dtype=np.float64)
    if scale == 1:
        arr = np.round(arr * 255)
    return arr.astype(np.uint8)
