"""bsr data: the config names the bad field, the EEG generator is seeded and physically
faithful (class effects where the physiology puts them), and the renderer's unit checks
(linear fields reproduced, exactly 0 outside the head disc, one dipole seen alike through
montages A and B)."""

from __future__ import annotations

import numpy as np
import pytest

from nshot.errors import ConfigError


def _cfg(**kw):
    from nshot.methods.bsr.config import BsrConfig

    base = dict(n_source_subjects=1, n_target_subjects=1, eval_subjects=1)
    return BsrConfig.from_preset("smoke", **{**base, **kw})


def test_config_validation_names_the_field():
    from nshot.methods.bsr.config import BsrConfig

    for field, bad in (("patch", 5), ("tubelet", 3), ("shots", [0]), ("system", "x"),
                       ("suppression", 1.0), ("n_source_trials", 10), ("heads", 3)):  # fmt: skip
        with pytest.raises(ConfigError, match=field):
            BsrConfig.from_preset("small", **{field: bad})
    # 16² grid, patch 8: 4 spatial patches; 0.9 masks 3 of them and leaves one visible, 0.2
    # masks none
    assert BsrConfig.from_preset("smoke", mask_ratio=0.9).n_masked == 3
    assert BsrConfig.from_preset("smoke", mask_ratio=0.99).n_masked == 3
    with pytest.raises(ConfigError, match="mask_ratio"):
        BsrConfig.from_preset("smoke", mask_ratio=0.2)
    for preset in BsrConfig.PRESETS:
        cfg = BsrConfig.from_preset(preset)
        assert 1 <= cfg.n_masked <= cfg.spatial_patches - 1


def test_generator_is_seeded_and_cached():
    from nshot.methods.bsr.data import MONTAGE_A, eeg_table, generate

    cfg = _cfg()
    t = eeg_table(cfg)  # built once (a first generation), then read back verified
    a = generate(cfg)  # a second generation, from the same seed
    assert t.equals(a) and eeg_table(cfg).equals(a)
    assert not a.column("eeg").equals(generate(cfg.replace(data_seed=1)).column("eeg"))
    n_src, n_tgt = cfg.n_source_trials, 4 * cfg.n_target_trials
    assert t.num_rows == n_src + n_tgt
    assert len(t.column("eeg")[0]) == len(MONTAGE_A) * cfg.samples
    labels = np.asarray(t.column("label").to_pylist())
    assert np.bincount(labels[n_src:]).tolist() == [cfg.n_target_trials] * 4


def test_class_effects_sit_where_the_physiology_puts_them():
    """μ (α band) and β power over C3 are lower for right-hand than for left-hand imagery (left
    motor cortex), over C4 the reverse, over Cz lower for feet than at rest; posterior α (not β)
    is stronger at rest."""
    from nshot.methods.bsr.data import MONTAGE_A, band_powers, load_dataset

    cfg = _cfg(n_target_trials=40, trial_s=4.0, n_source_trials=4)
    ds = load_dataset(cfg)
    x, y = ds.subject(ds.names("target")[0])
    p = band_powers(x, cfg.sfreq, cfg.window, cfg.frames).mean(1)  # (n, 3 bands, C)
    m = {k: p[y == k].mean(0) for k in range(4)}
    c3, c4, cz, oz = (MONTAGE_A.index(c) for c in ("C3", "C4", "Cz", "Oz"))
    for band in (1, 2):  # α (μ), β
        assert m[0][band, c3] - m[1][band, c3] > 0.05
        assert m[1][band, c4] - m[0][band, c4] > 0.05
        assert m[3][band, cz] - m[2][band, cz] > 0.05
    others = np.mean([m[k][:, oz] for k in range(3)], axis=0)
    assert m[3][1, oz] - others[1] > 0.05 and m[3][1, oz] - others[1] > m[3][2, oz] - others[2]


@pytest.mark.parametrize("montage", ["A", "B", "C"])
def test_interpolation_reproduces_linear_fields_and_is_zero_outside_the_disc(montage):
    from nshot.methods.bsr.data import (
        CLASS_ELECTRODES,
        MONTAGE_A,
        MONTAGES,
        grid_coords,
        interpolation_matrix,
        montage_channels,
        montage_xy,
    )

    picked = [MONTAGE_A[i] for i in montage_channels(montage)]
    assert picked == list(MONTAGES[montage])  # a montage reads its channels out of A's trials
    # B keeps every electrode above a class source, C none of them
    assert (
        set(CLASS_ELECTRODES) <= set(picked)
        if montage != "C"
        else not set(CLASS_ELECTRODES) & set(picked)
    )

    xy = montage_xy(montage)
    m, inside = interpolation_matrix(xy, 32)
    pix, disc = grid_coords(32)
    rng = np.random.default_rng(0)
    for _ in range(3):
        a, c = rng.normal(size=2), rng.normal()
        err = np.abs(m[inside].astype(np.float64) @ (xy @ a + c) - (pix[inside] @ a + c))
        assert err.max() < 1e-6
    assert (m[~disc] == 0).all() and (np.abs(m[disc]).sum(1) > 0).all()
    assert inside.sum() > 100


def test_rendered_videos_are_exactly_zero_outside_the_head():
    from nshot.methods.bsr.data import (
        NormStats,
        band_powers,
        grid_coords,
        interpolation_matrix,  # fmt: skip
        montage_xy,
        render,
    )

    rng = np.random.default_rng(1)
    eeg = rng.normal(size=(3, 32, 256)) * 1e-5
    p = band_powers(eeg, 128.0, 64, 8)
    stats = NormStats.fit(p[:2])
    v = render(stats.apply(p), interpolation_matrix(montage_xy("A"), 16)[0], 16)
    assert v.shape == (3, 8, 3, 16, 16)
    _, disc = grid_coords(16)
    assert (v.reshape(3, 8, 3, -1)[..., ~disc] == 0).all()
    assert np.abs(v.reshape(3, 8, 3, -1)[..., disc]).sum() > 0


def test_one_deep_dipole_renders_alike_through_both_montages():
    from nshot.methods.bsr.data import (
        MONTAGE_A,
        gain_matrix,
        head_model,
        interpolation_matrix,
        montage_channels,  # fmt: skip
        montage_xy,
    )

    head = head_model(15.0)
    g = gain_matrix(head, MONTAGE_A, np.eye(3))
    s = int(np.argmin(np.linalg.norm(head.rr - head.centre, axis=1)))
    v = g[:, 3 * s : 3 * s + 3] @ np.array([0.0, 0.0, 1.0])
    ma, _ = interpolation_matrix(montage_xy("A"), 32)
    mb, inside_b = interpolation_matrix(montage_xy("B"), 32)
    a, b = ma @ v, mb @ v[montage_channels("B")]
    assert np.linalg.norm((a - b)[inside_b]) / np.linalg.norm(a[inside_b]) <= 0.10


def test_degenerate_montages_are_refused_naming_positions_and_the_cache_is_bounded():
    from nshot.methods.bsr import data
    from nshot.methods.bsr.data import interpolation_matrix

    line = np.c_[np.zeros(6), np.linspace(-0.6, 0.6, 6)]  # distinct, but on one line
    with pytest.raises(ValueError, match="^positions: .*no area"):
        interpolation_matrix(line, 16)
    square = np.array([[-0.5, -0.5], [0.5, -0.5], [0.5, 0.5], [-0.5, 0.5], [0.5, -0.5]])
    with pytest.raises(ValueError, match=r"^positions\[4\]: .*positions\[1\]"):
        interpolation_matrix(square, 16)
    for shift in np.linspace(0.0, 0.1, data._M_CACHE_SIZE + 5):  # montages a client could send
        interpolation_matrix(square[:4] + shift, 16)
    assert len(data._M_CACHE) == data._M_CACHE_SIZE
