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

    base = dict(n_source_subjects=1, n_target_subjects=1, eval_subjects=1, select_subjects=0)
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
        assert cfg.generator_version == 2  # the declared default of every preset
    # eegbci trials start at the cue and its periods last about 4 s; the recipe choice needs a
    # query on the validation subjects
    with pytest.raises(ConfigError, match="trial_s"):
        BsrConfig.from_preset("small", dataset="eegbci", data_path="/data")
    assert BsrConfig.from_preset("small", dataset="eegbci", data_path="/data", trial_s=4.0)
    with pytest.raises(ConfigError, match="select_shots"):
        BsrConfig.from_preset("small", select_shots=20)
    with pytest.raises(ConfigError, match="select_subjects"):
        BsrConfig.from_preset("smoke", select_subjects=4)


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


def _one_subject(version: int, per_class: int = 30, seed: int = 0, **kw):
    """One generated target subject's trials (its own streams, as ``generate`` draws them) and
    labels; 6 s trials in both versions, so that their frames line up."""
    from nshot.methods.bsr.data import _subject_trials, head_model

    cfg = _cfg(generator_version=version, trial_s=6.0, frames=16, **kw)
    rng = np.random.default_rng([cfg.data_seed, 1, seed])
    timing = np.random.default_rng([cfg.data_seed, 1, seed, 2])
    labels = rng.permutation(np.repeat(np.arange(4), per_class))
    return cfg, _subject_trials(cfg, head_model(cfg.source_spacing_mm), rng, labels, timing), labels


def test_generator_version_2_has_cue_locked_desynchronisation_and_a_beta_rebound():
    """Version 2's structure (paper §4's motor imagery, Pfurtscheller's ERD/ERS): band power
    differs between early and late frames. Before the cue no class differs; during imagery μ
    (α band) and β power over the contralateral motor area (C4 for the left hand, C3 for the
    right, Cz for the feet) are below their pre-cue level; after the imagery β over the feet's
    area overshoots its imagery level and its baseline (the rebound). Version 1 (the same
    frames) is stationary: its class map holds before the cue too and no frame differs."""
    from nshot.methods.bsr.data import MONTAGE_A, REBOUND_DELAY_S, band_powers, frame_starts

    c3, c4, cz = (MONTAGE_A.index(c) for c in ("C3", "C4", "Cz"))
    out = {}
    for version in (1, 2):
        # the structure is checked where the rhythms dominate (little background and noise)
        cfg, x, y = _one_subject(version, per_class=100, background_rel=0.2, sensor_noise_rel=0.05)
        p = band_powers(x, cfg.sfreq, cfg.window, cfg.frames)  # (n, F, 3, C)
        start = frame_starts(cfg.samples, cfg.window, cfg.frames) / cfg.sfreq
        end = start + cfg.window_s
        pre = end <= cfg.cue_s  # windows wholly before the cue
        during = (start >= cfg.cue_s + 1.0) & (end <= cfg.cue_s + cfg.imagery_s)
        peak = cfg.cue_s + cfg.imagery_s + cfg.erd_latency_s + REBOUND_DELAY_S
        after = np.abs(start + cfg.window_s / 2 - peak) <= 0.3  # frames centred on the rebound
        assert pre.sum() >= 2 and during.sum() >= 4 and after.sum() >= 1

        def m(cls, frames, band, ch, p=p, y=y):
            return p[y == cls][:, frames, band, ch].mean()

        out[version] = {
            # early vs late frames of one class at its own electrode (α band: μ; β)
            "left_C4_mu": m(0, pre, 1, c4) - m(0, during, 1, c4),
            "right_C3_beta": m(1, pre, 2, c3) - m(1, during, 2, c3),
            "feet_Cz_mu": m(2, pre, 1, cz) - m(2, during, 1, cz),
            # the class contrast at C4 (right minus left hand) before the cue and during imagery
            "contrast_pre": m(1, pre, 1, c4) - m(0, pre, 1, c4),
            "contrast_during": m(1, during, 1, c4) - m(0, during, 1, c4),
            # the β rebound at Cz after feet imagery: above the imagery level and the baseline
            "rebound_vs_during": m(2, after, 2, cz) - m(2, during, 2, cz),
            "rebound_vs_pre": m(2, after, 2, cz) - m(2, pre, 2, cz),
        }
    v1, v2 = out[1], out[2]
    for key in ("left_C4_mu", "right_C3_beta", "feet_Cz_mu"):
        assert v2[key] > 0.12, (key, v2[key])  # log10 power: -40 % is 0.22
        assert abs(v1[key]) < 0.07, (key, v1[key])
    assert abs(v2["contrast_pre"]) < 0.07 and v2["contrast_during"] > 0.1, v2
    assert v1["contrast_pre"] > 0.1 and v1["contrast_during"] > 0.1, v1
    assert v2["rebound_vs_during"] > 0.2 and v2["rebound_vs_pre"] > 0.05, v2
    assert abs(v1["rebound_vs_during"]) < 0.07, v1


def test_generator_version_2_time_courses_and_subject_latency():
    """The power factors of version 2: 1 before the cue for every class (up to the logistic
    onset's tail); half the drop at the
    subject's latency after the cue; the full drop during imagery over the class's area only
    (left hand → C4, right → C3, feet → Cz; none at rest, where posterior α rises instead);
    β above 1 after the imagery. Subjects' latencies differ (s.d. latency_jitter_s)."""
    from nshot.methods.bsr.data import erd_courses, subject_latency

    cfg = _cfg(generator_version=2, trial_s=6.0)
    labels = np.repeat(np.arange(4), 200)
    latency = 0.6
    c = erd_courses(cfg, labels, latency, np.random.default_rng(0))
    t = np.arange(cfg.samples) / cfg.sfreq
    at = lambda s: int(np.argmin(np.abs(t - s)))  # noqa: E731
    for cls, src in ((0, 1), (1, 0), (2, 2)):
        mu = c["mu"][labels == cls].mean(0)  # (3 sources, T)
        assert abs(mu[src, at(cfg.cue_s * 0.5)] - 1.0) < 1e-3  # the logistic onset's tail
        assert abs(mu[src, at(cfg.cue_s + latency)] - (1 - cfg.suppression / 2)) < 0.03
        assert abs(mu[src, at(cfg.cue_s + 2.0)] - (1 - cfg.suppression)) < 0.01
        others = [s for s in range(3) if s != src]
        assert np.allclose(c["mu"][labels == cls][:, others], 1.0)
        beta = c["beta"][labels == cls].mean(0)[src]
        assert beta[t > cfg.cue_s + cfg.imagery_s + latency].max() > 1 + 0.5 * cfg.beta_rebound
    assert np.allclose(c["mu"][labels == 3], 1.0) and np.allclose(c["beta"][labels == 3], 1.0)
    rest_alpha = c["alpha"][labels == 3].mean(0)[0]
    assert abs(rest_alpha[at(0.5)] - 1) < 1e-3 and rest_alpha[at(2.5)] > 1 + 0.9 * cfg.alpha_boost
    assert np.allclose(c["alpha"][labels != 3], 1.0)
    lat = [subject_latency(cfg, np.random.default_rng([0, i])) for i in range(2000)]
    assert abs(np.mean(lat) - cfg.erd_latency_s) < 0.02
    assert abs(np.std(lat) - cfg.latency_jitter_s) < 0.02


def test_generator_version_1_keeps_its_data_key_and_trials():
    """Version 1 stays reproducible by its field: its cache key is the key from before the
    versions (no version-2 field in it), and its trials do not depend on version 2's timing
    fields, which do change version 2's."""
    from nshot.methods.bsr.config import DATA_FIELDS

    v1 = _cfg(generator_version=1)
    assert list(v1.data_key()) == list(DATA_FIELDS)
    assert v1.data_key() == v1.replace(erd_latency_s=0.9, beta_rebound=1.0).data_key()
    assert v1.replace(generator_version=2).data_key() != v1.data_key()
    _, a, _ = _one_subject(1, per_class=2)
    _, b, _ = _one_subject(1, per_class=2, erd_latency_s=0.9, beta_rebound=1.0)
    np.testing.assert_array_equal(a, b)
    _, c, _ = _one_subject(2, per_class=2)
    _, d, _ = _one_subject(2, per_class=2, beta_rebound=1.0)
    assert not np.array_equal(c, d)
