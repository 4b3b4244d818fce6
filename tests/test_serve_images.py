"""The shared image checks of request bodies (nshot.serve.images)."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from nshot.serve.images import check_rgb_array, decode_base64_image


def _b64(arr: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> str:
    buf = io.BytesIO()
    Image.fromarray(arr, mode=mode).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def test_base64_images_decode_to_rgb_uint8_and_bad_ones_name_the_field():
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert np.array_equal(decode_base64_image(_b64(rgb), "x"), rgb)
    grey = np.full((4, 4), 9, np.uint8)
    out = decode_base64_image(_b64(grey, mode="L"), "x")  # converted unless rgb_only
    assert out.shape == (4, 4, 3) and (out == 9).all()
    with pytest.raises(ValueError, match=r"^img\[2\]: 1 channel\(s\) \(L\); expected RGB"):
        decode_base64_image(_b64(grey, mode="L"), "img[2]", rgb_only=True)
    with pytest.raises(ValueError, match="^x: a JPEG image; send PNG$"):
        decode_base64_image(_b64(rgb, "JPEG"), "x")
    assert decode_base64_image(_b64(rgb, "JPEG"), "x", formats=("PNG", "JPEG")).shape == (5, 7, 3)
    with pytest.raises(ValueError, match="^x: not valid base64"):
        decode_base64_image("not base64!", "x")
    broken = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(40)).decode()
    with pytest.raises(ValueError, match="^x: not a decodable PNG image"):
        decode_base64_image(broken, "x")
    with pytest.raises(ValueError, match="exceeds 4 a side"):
        decode_base64_image(_b64(rgb), "x", max_side=4)


def test_arrays_in_both_value_ranges():
    a255 = [[[0, 128, 255], [1, 2, 3]]]
    assert check_rgb_array(a255, "x").tolist() == a255
    floats = [[[0.0, 0.5, 1.0]]]
    assert check_rgb_array(floats, "x", scale=1).tolist() == [[[0, 128, 255]]]
    bad = {
        "height 0 is outside": [],
        "row 1 has 1 pixels, row 0 has 2": [[[0, 0, 0], [0, 0, 0]], [[0, 0, 0]]],
        "a pixel has 4 values": [[[0, 0, 0, 0]]],
        r"value 256 is outside \[0, 255\]": [[[0, 256, 0]]],
        "contains NaN or inf": [[[0, float("nan"), 0]]],
    }
    for msg, arr in bad.items():
        with pytest.raises(ValueError, match=f"^y: {msg}"):
            check_rgb_array(arr, "y")
    with pytest.raises(ValueError, match=r"value 1.5 is outside \[0, 1\]"):
        check_rgb_array([[[0.0, 1.5, 0.0]]], "y", scale=1)
    with pytest.raises(ValueError, match="width 3 is outside"):
        check_rgb_array([[[0, 0, 0]] * 3], "y", max_side=2)
