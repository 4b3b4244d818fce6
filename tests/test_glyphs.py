"""Recipe 9 of the tiny CLIP: printed numerals (:mod:`nshot.data.glyphs`) and line drawings of
the shapes (:func:`nshot.data.shapes.render_drawings`) beside the captioned shapes. The tests
pin the structure each source adds: numerals from the font, captioned with their words, and
outlines whose interior is the background."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.ndimage import distance_transform_edt, label

from nshot.data.glyphs import (
    DIGIT_WORDS,
    GLYPH_HEIGHTS,
    glyph_alpha,
    glyph_caption,
    glyph_mask,
    glyphs_table,
    render_glyphs,
)
from nshot.data.shapes import (
    BACKGROUNDS,
    COLOURS,
    DRAWING_STROKES,
    HELDOUT_COMBOS,
    SHAPES,
    drawing_alpha,
    drawings_table,
    render_drawings,
    render_shapes,
    shape_alpha,
    shapes_arrays,
)
from nshot.nn.clip import WordTokenizer
from nshot.train import clip as tc

RECIPE_9 = "small-cls-ln-glyphs"


def test_glyphs_are_deterministic_and_captioned_with_the_numeral_words():
    a, b, c = render_glyphs(40, seed=1), render_glyphs(40, seed=1), render_glyphs(40, seed=2)
    assert a["image"].dtype == np.uint8 and a["image"].shape == (40, 32, 32, 3)
    assert np.array_equal(a["image"], b["image"]) and list(a["caption"]) == list(b["caption"])
    assert not np.array_equal(a["image"], c["image"])
    for d, cap in zip(a["digit"].tolist(), a["caption"], strict=True):
        assert cap == f"a photo of the number {DIGIT_WORDS[d]}"
    assert glyph_caption(7, 1) == "a photo of a seven"
    assert DIGIT_WORDS == tc.DIGIT_NAMES  # the digits preset's and atha's class names
    big = render_glyphs(400, seed=0)
    assert set(big["digit"].tolist()) == set(range(10))
    lo, hi = GLYPH_HEIGHTS
    assert lo * 32 <= big["height"].min() and big["height"].max() <= hi * 32
    # the numeral is drawn in its colour on its background: the pixels most unlike the
    # background are the colour's
    for i in range(8):
        img = a["image"][i].astype(float)
        rgb = np.array(list(COLOURS.values())[a["colour"][i]], dtype=float)
        bg = np.array(list(BACKGROUNDS.values())[a["background"][i]], dtype=float)
        if np.linalg.norm(rgb - bg) < 80:  # yellow on white: too close to tell apart
            continue
        far = np.linalg.norm(img - bg, axis=-1) > 0.8 * np.linalg.norm(rgb - bg)
        assert far.sum() > 10 and np.abs(img[far].mean(0) - rgb).max() < 30


def test_glyphs_are_the_fonts_numerals():
    """The rasterised outlines have the numerals' topology: the counters (enclosed holes) of
    0, 4, 6, 8, 9 and none in 1, 2, 3, 5, 7."""
    counters = {0: 1, 1: 0, 2: 0, 3: 0, 4: 1, 5: 0, 6: 1, 7: 0, 8: 2, 9: 1}
    for d, holes in counters.items():
        ink = np.pad(glyph_mask(d), 2)
        parts, n = label(~ink)
        sizes = np.bincount(parts.ravel())[1:]
        assert (sizes > 100).sum() - 1 == holes, d  # (a cell or two where contours touch)
        parts, n = label(ink)
        assert (np.bincount(parts.ravel())[1:] > 100).sum() == 1, d  # one stroke
    assert glyph_mask(1).shape[1] < glyph_mask(0).shape[1]  # a "1" is narrower than a "0"
    # the coverage of an image follows the mask: the "0" at 64 px is empty at its centre
    alpha = glyph_alpha(0, 64, x0=16, y0=8, height=48)
    w = glyph_mask(0).shape[1] / glyph_mask(0).shape[0] * 48
    assert alpha[32, int(16 + w / 2)] == 0 and alpha.max() == 1
    assert alpha[:8].sum() == 0 and alpha[57:].sum() == 0 and alpha[:, :16].sum() == 0


def test_glyphs_table_round_trip(nshot_cache):
    t = glyphs_table(24, seed=3)
    assert t.equals(glyphs_table(24, seed=3))
    x, y = shapes_arrays(t, uint8=True)
    ref = render_glyphs(24, seed=3)
    assert np.array_equal(x, ref["image"].transpose(0, 3, 1, 2))
    assert np.array_equal(y, ref["digit"].astype(np.int64))


def test_drawings_are_outlines_of_the_shapes():
    """Each drawing is the shape's outline in its colour: the interior (more than a stroke and
    a pixel inside the edge) keeps the background, the line carries the colour, and the
    drawing covers less than the filled shape."""
    d = render_drawings(64, seed=0)
    assert np.array_equal(d["image"], render_drawings(64, seed=0)["image"])
    assert not np.array_equal(d["image"], render_drawings(64, seed=1)["image"])
    assert not np.array_equal(d["image"], render_shapes(64, seed=0)["image"])
    lo, hi = DRAWING_STROKES
    assert lo <= d["stroke"].min() and d["stroke"].max() <= hi
    assert np.abs(np.rad2deg(d["angle"])).max() <= 15.0  # the source's rotation
    interiors, ratios = 0, []
    for i in range(len(d["image"])):
        s = int(d["shape"][i])
        assert d["caption"][i] == f"a drawing of a {SHAPES[s]}"
        geo = {k: float(d[k][i]) for k in ("cx", "cy", "radius", "angle")}
        filled = shape_alpha(s, 32, **geo)
        line = drawing_alpha(s, 32, **geo, stroke=float(d["stroke"][i]))
        assert line.sum() < filled.sum() and np.all(line <= filled + 1e-6)
        ratios.append(line.sum() / filled.sum())
        img = d["image"][i].astype(float)
        bg = np.array(list(BACKGROUNDS.values())[d["background"][i]], dtype=float)
        rgb = np.array(list(COLOURS.values())[d["colour"][i]], dtype=float)
        inner = distance_transform_edt(filled == 1) > d["stroke"][i] + 1.0
        interiors += int(inner.sum())
        # jitter (±10) and noise (sd 3) only: the interior is the background
        assert np.all(np.abs(img[inner] - bg) < 10 + 4 * 3 + 1)
        # every pixel is the line in its colour over the background (colour jitter ±18)
        model = bg * (1 - line[..., None]) + rgb * line[..., None]
        assert line.sum() > 8 and np.all(np.abs(img - model) < 18 + 10 + 4 * 3 + 1)
    assert interiors > 500  # the check saw interiors
    assert np.mean(ratios) < 0.6  # the line covers much less than the filled shape
    train = render_drawings(400, seed=0, split="train")
    pairs = set(zip(train["shape"].tolist(), train["colour"].tolist(), strict=True))
    assert not pairs & set(HELDOUT_COMBOS)
    test = drawings_table(16, seed=0, split="test")
    assert set(test.column("caption").to_pylist()) <= {f"a drawing of a {s}" for s in SHAPES}


def test_recipe_9_preset_adds_glyphs_and_drawings_to_recipe_8():
    p8, p9 = tc.PRESETS["small-cls-ln"], tc.PRESETS[RECIPE_9]
    added = {"source": tc.MIXED_SOURCE, "glyphs": 10_000, "drawings": 10_000, "version": "9"}
    assert dataclasses.replace(p8, **added) == p9  # nothing else changes
    assert (p9.images, p9.steps, p9.batch, p9.side) == (20_000, 1500, 128, 32)
    # a recipe's version names its cache folder: no other preset's cached CLIP is reused
    others = [p.version for name, p in tc.PRESETS.items() if name != RECIPE_9]
    assert p9.version not in others
    # the word tower's vocabulary is recipe 8's and knows every caption recipe 9 draws
    c8, c9 = tc.clip_config("small-cls-ln", "word"), tc.clip_config(RECIPE_9, "word")
    assert c9 == c8
    captions = tc.all_captions(tc.MIXED_SOURCE)
    assert WordTokenizer(c9.vocab, c9.context).unknown_words(captions) == 0
    assert set(tc.all_captions("shapes")) < set(captions)
    for d in range(10):
        assert glyph_caption(d, 0) in captions and glyph_caption(d, 1) in captions
    for s in SHAPES:
        assert f"a drawing of a {s}" in captions


def test_recipe_9_captions_and_source(nshot_cache, monkeypatch):
    """The mixed source stacks shapes, numerals and drawings; a batch's captions name each
    row's kind, and the shape rows draw the same captions as recipe 8's."""
    shapes = render_shapes(6, seed=0)
    attrs4 = np.stack([shapes[k].astype(np.int64) for k in tc.SHAPE_ATTRS], axis=1)
    attrs = np.concatenate([attrs4, np.zeros((6, 1), dtype=np.int64)], axis=1)
    attrs = np.concatenate([attrs, [[7, 0, 0, 1, 1], [3, 2, 1, 0, 2]]])
    caps = tc._batch_captions(attrs, step=5, seed=0, source=tc.MIXED_SOURCE)
    assert caps[:6] == tc._batch_captions(attrs4, step=5, seed=0)
    assert caps[6] in {"a photo of the number seven", "a photo of a seven"}
    assert caps[7] == "a drawing of a star"
    forms = {
        tc._batch_captions(attrs[6:7], step=s, seed=0, source=tc.MIXED_SOURCE)[0] for s in range(20)
    }
    assert forms == {"a photo of the number seven", "a photo of a seven"}

    tiny = dataclasses.replace(tc.PRESETS[RECIPE_9], images=24, glyphs=12, drawings=12)
    x, a = tc._source(tiny, 0, "train")
    assert x.shape == (48, 3, 32, 32) and x.dtype == np.uint8 and a.shape == (48, 5)
    assert np.bincount(a[:, 4]).tolist() == [24, 12, 12]
    glyphs = render_glyphs(12, seed=0)
    assert np.array_equal(x[24:36], glyphs["image"].transpose(0, 3, 1, 2))
    assert np.array_equal(a[24:36, 0], glyphs["digit"])
    drawings = render_drawings(12, seed=0)
    assert np.array_equal(x[36:], drawings["image"].transpose(0, 3, 1, 2))


@pytest.mark.timeout(300)
def test_recipe_9_pretrains_and_reports_the_added_pairings(nshot_cache, tmp_path, monkeypatch):
    """A few steps of a tiny mixed preset (the word tower), resumable like the others, and
    its zero-shot report carries the numerals' and drawings' accuracies."""
    tiny = dataclasses.replace(
        tc.PRESETS["smoke"], source=tc.MIXED_SOURCE, images=64, glyphs=32, drawings=32
    )
    monkeypatch.setitem(tc.PRESETS, "tiny-mixed", tiny)
    monkeypatch.setattr(tc, "GLYPH_TEST_IMAGES", 40)
    full = tc.pretrain("tiny-mixed", out=tmp_path / "full", steps=4, text="word")
    part = tc.pretrain("tiny-mixed", out=tmp_path / "part", steps=4, stop_at=2, text="word")
    rest = tc.pretrain("tiny-mixed", out=tmp_path / "part", steps=4, text="word")
    assert full.finished and not part.finished and rest.losses == full.losses
    report = tc.zero_shot_report(tc.load_clip(tmp_path / "full"), "tiny-mixed")
    assert 0 <= report["acc_glyphs_10way"] <= 1 and 0 <= report["acc_drawings_8way"] <= 1
    assert 0 <= report["acc_src_8way"] <= 1
