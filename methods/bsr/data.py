"""Generated motor-imagery EEG through MNE's forward model, and its rendering into spectrum videos.

No real EEG ships in any package, so the data are generated with physics (a reconstruction of
the paper's §4 protocol): a volume source space on a 3-shell sphere head model fitted to the
10-20 electrode positions, MNE's EEG forward solution per subject, and dipolar sources:

* μ (10 Hz) and β (20 Hz) rhythms at the grid points below C3, C4 and Cz (motor cortex), whose
  power drops by ``suppression`` over the area of the imagined movement (left hand: right motor
  area, below C4; right hand: below C3; feet: below Cz; rest: none);
* occipital α dipoles below O1 and O2 with a subject-specific peak (8.5–11.5 Hz), ``alpha_boost``
  stronger at rest;
* 1/f background activity of every source (as its sensor covariance G Gᵀ) and white sensor noise.

Subjects differ: dipoles move to neighbouring grid points, orientations tilt by up to 20°, the cap
is rotated by 3–5° about the head centre, the global amplitude is log-normal (σ 0.3) and the α
peak varies.

Two declared versions (``generator_version``). Version 1: the class effects above hold for the
whole trial (stationary trials: the class is a static band-power map). Version 2 (the default):
cue-locked motor imagery, following the event-related (de)synchronisation of the sensorimotor
rhythms (Pfurtscheller & Lopes da Silva 1999, Clin. Neurophysiol. 110:1842; motor imagery:
Pfurtscheller et al. 2006, NeuroImage 31:153; the β rebound after imagery: Pfurtscheller et
al. 2005, Neurosci. Lett. 378:156). The trial holds ``cue_s`` of rest before the cue, identical
for every class (the subject does not yet know the task); μ and β power over the moving limb's
area drop by ``suppression`` from about ``erd_latency_s`` after the cue (a logistic onset, time
constant ``ERD_TAU_S``), stay down for the ``imagery_s`` of imagery and recover with the same
delay after it; β then overshoots its baseline by ``beta_rebound`` at its peak
(``REBOUND_DELAY_S`` after the recovery, s.d. ``REBOUND_WIDTH_S``), the post-imagery β rebound;
at rest the posterior α rise follows the same cue-locked onset. Each subject has its own latency
(s.d. ``latency_jitter_s``), each trial a small jitter around it (s.d. ``TRIAL_JITTER_S``).
The random draws of the timing come from their own stream, so the sources, background and noise
of a version-2 subject are drawn as in version 1. All trials are stored on montage A's 32 channels; montage B (the classic 19) is a
subset of them, so the same source activity is seen through both layouts. Montage B keeps every
electrode above a class source (C3, Cz, C4, O1, O2), so it cannot break a model that reads those
channels; montage C (27 channels) is montage A without those five: the class activity reaches it
only through volume conduction to the neighbouring electrodes (FC1/FC2/FC5/FC6, CP1/CP2/CP5/CP6,
PO3/PO4/Oz), the situation of a cap whose electrodes do not sit where the training cap's did.

Rendering (paper §3, reconstructed): per frame (Hann window) the log10 mean power in θ (4–8 Hz),
α (8–13 Hz) and β (13–30 Hz) → per-subject z-score per band → a fixed linear map M per montage
(Clough–Tocher inside the electrode hull, nearest in-hull value out to the head disc, exactly 0
outside it) → a video (F, 3, H, W).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa

from nshot.data.cache import cache_dir, cached_table
from nshot.errors import NshotError
from nshot.hashing import sha256_file

from .config import BsrConfig

MONTAGE_A = (
    "Fp1 Fp2 AF3 AF4 F7 F3 Fz F4 F8 FC5 FC1 FC2 FC6 T7 C3 Cz C4 T8 CP5 CP1 CP2 CP6 "
    "P7 P3 Pz P4 P8 PO3 PO4 O1 Oz O2"
).split()
MONTAGE_B = "Fp1 Fp2 F7 F3 Fz F4 F8 T7 C3 Cz C4 T8 P7 P3 Pz P4 P8 O1 O2".split()
CLASS_ELECTRODES = ("C3", "Cz", "C4", "O1", "O2")  # the electrodes above the class sources
MONTAGE_C = [c for c in MONTAGE_A if c not in CLASS_ELECTRODES]
MONTAGES = {"A": MONTAGE_A, "B": MONTAGE_B, "C": MONTAGE_C}
CLASSES = ("left_hand", "right_hand", "feet", "rest")
BANDS = ((4.0, 8.0), (8.0, 13.0), (13.0, 30.0))  # θ, α, β → the 3 video channels
DATA_VERSION = "1"  # of the cached table's format (the generator's own version is a config field)
DISC_EDGE = 0.95  # montage A's farthest electrode sits at this radius of the disc


# ---------------------------------------------------------------------------------------------
# electrode positions and the projection onto the scalp disc


@lru_cache(maxsize=1)
def standard_positions() -> dict[str, np.ndarray]:
    """Head-frame positions (metres) of the 94 electrodes of MNE's 10-20 template (colin27)."""
    import mne

    montage = mne.channels.make_standard_montage("colin27_1020")
    info = mne.create_info(montage.ch_names, 128.0, "eeg")
    info.set_montage(montage)
    return {ch["ch_name"]: np.array(ch["loc"][:3], dtype=np.float64) for ch in info["chs"]}


@lru_cache(maxsize=1)
def head_frame() -> tuple[np.ndarray, float]:
    """Centre of the sphere fitted to all 94 template electrodes, and the largest polar angle
    among montage A's electrodes (the 10-20 ring Fp1 … O1 … T7). Fixed for every montage, so
    that any layout projects onto the same disc with the nose up."""
    table = standard_positions()
    pos = np.stack(list(table.values()))
    # algebraic sphere fit: |p|^2 = 2 c·p + (r^2 - |c|^2)
    a = np.c_[2 * pos, np.ones(len(pos))]
    sol, *_ = np.linalg.lstsq(a, (pos**2).sum(1), rcond=None)
    centre = sol[:3]
    theta = _polar(np.stack([table[c] for c in MONTAGE_A]), centre)[0]
    return centre, float(theta.max())


def _polar(pos: np.ndarray, centre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = pos - centre
    u = v / np.linalg.norm(v, axis=1, keepdims=True)
    return np.arccos(np.clip(u[:, 2], -1.0, 1.0)), np.arctan2(u[:, 1], u[:, 0])


def project(pos: np.ndarray) -> np.ndarray:
    """Azimuthal-equidistant projection of head-frame positions (n, 3) onto the unit disc:
    (x right, y towards the nose); the template's farthest electrode lands at ``DISC_EDGE``."""
    centre, theta_max = head_frame()
    theta, phi = _polar(np.asarray(pos, dtype=np.float64), centre)
    r = theta / theta_max * DISC_EDGE
    return np.c_[r * np.cos(phi), r * np.sin(phi)]


def positions_for(ch_names: list[str]) -> np.ndarray:
    table = standard_positions()
    return np.stack([table[c] for c in ch_names])


# ---------------------------------------------------------------------------------------------
# the interpolation matrix


def grid_coords(grid: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel centres (H·W, 2) in disc coordinates (row 0 at the top, the nose up) and the head
    mask (H·W,) of pixels inside the unit disc."""
    c = (np.arange(grid) + 0.5) / grid * 2.0 - 1.0
    gx, gy = np.meshgrid(c, -c)
    xy = np.c_[gx.ravel(), gy.ravel()]
    return xy, (xy**2).sum(1) <= 1.0


def montage_hash(xy: np.ndarray, grid: int) -> str:
    h = hashlib.sha256(np.round(np.asarray(xy, np.float64), 9).tobytes())
    h.update(str(grid).encode())
    return h.hexdigest()[:16]


# the most recently used montages (least recent evicted first): a client may send any positions
_M_CACHE: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
_M_CACHE_SIZE = 16


def interpolation_matrix(xy: np.ndarray, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """M (H·W, C) with video = M · values, and the in-hull pixel mask (H·W,). Cached per montage.

    Clough–Tocher interpolation of each unit vector e_c inside the electrodes' convex hull (the
    interpolant is linear in the data, so M · v equals interpolating v); pixels of the head disc
    outside the hull copy the row of the nearest in-hull pixel; pixels outside the disc are 0.
    """
    from scipy.interpolate import CloughTocher2DInterpolator
    from scipy.spatial import QhullError, cKDTree

    key = montage_hash(xy, grid)
    if key in _M_CACHE:
        _M_CACHE.move_to_end(key)
        return _M_CACHE[key]
    xy = np.asarray(xy, dtype=np.float64)
    c = len(xy)
    _, first, inverse = np.unique(np.round(xy, 9), axis=0, return_index=True, return_inverse=True)
    for i, j in enumerate(first[inverse.reshape(-1)]):
        if j != i:
            raise ValueError(f"positions[{i}]: projects onto the same point as positions[{j}]")
    pix, disc = grid_coords(grid)
    try:
        interp = CloughTocher2DInterpolator(xy, np.eye(c), tol=1e-12, maxiter=10_000)
    except QhullError:
        raise ValueError(
            "positions: the electrodes span no area on the head disc (all on one point or one "
            "line once projected); give positions spread over the scalp"
        ) from None
    m = interp(pix)  # (H·W, C); NaN outside the hull
    inside = ~np.isnan(m).any(1) & disc
    m[~inside] = 0.0
    if not inside.any():
        raise ValueError("positions: no pixel of the grid lies inside the electrodes' hull")
    fill = disc & ~inside
    if fill.any():
        _, nearest = cKDTree(pix[inside]).query(pix[fill])
        m[fill] = m[inside][nearest]
    out = (m.astype(np.float32), inside)
    _M_CACHE[key] = out
    while len(_M_CACHE) > _M_CACHE_SIZE:
        _M_CACHE.popitem(last=False)
    return out


# ---------------------------------------------------------------------------------------------
# spectral frames and videos


def frame_starts(n_samples: int, window: int, frames: int) -> np.ndarray:
    """First sample of each of ``frames`` windows spread evenly over the trial."""
    if n_samples < window:
        raise ValueError(f"a trial of {n_samples} samples is shorter than one window ({window})")
    hop = (n_samples - window) / max(frames - 1, 1)
    return np.round(np.arange(frames) * hop).astype(np.int64)


def band_powers(eeg: np.ndarray, sfreq: float, window: int, frames: int) -> np.ndarray:
    """log10 mean band power per frame, band and channel: (..., C, T) → (..., F, 3, C)."""
    eeg = np.asarray(eeg, dtype=np.float64)
    starts = frame_starts(eeg.shape[-1], window, frames)
    idx = starts[:, None] + np.arange(window)[None, :]
    seg = eeg[..., idx]  # (..., C, F, w)
    seg = seg - seg.mean(-1, keepdims=True)
    spec = np.abs(np.fft.rfft(seg * np.hanning(window), axis=-1)) ** 2
    freqs = np.fft.rfftfreq(window, 1.0 / sfreq)
    out = []
    for lo, hi in BANDS:
        sel = (freqs >= lo) & (freqs < hi)
        out.append(np.log10(spec[..., sel].mean(-1) + 1e-30))
    p = np.stack(out, axis=-1)  # (..., C, F, 3)
    return np.moveaxis(p, -3, -1)  # (..., F, 3, C)


@dataclass(frozen=True)
class NormStats:
    """Per-band mean and std of log band power (3,), from the trials a model may see."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, powers: np.ndarray) -> NormStats:
        flat = np.moveaxis(np.asarray(powers), -2, 0).reshape(3, -1)
        return cls(flat.mean(1), np.maximum(flat.std(1), 1e-6))

    def apply(self, powers: np.ndarray) -> np.ndarray:
        return (powers - self.mean[:, None]) / self.std[:, None]

    def to_json(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> NormStats:
        return cls(np.asarray(d["mean"], np.float64), np.asarray(d["std"], np.float64))


def render(powers_z: np.ndarray, m: np.ndarray, grid: int) -> np.ndarray:
    """Normalised band powers (..., F, 3, C) → videos (..., F, 3, H, W) via M (H·W, C).
    Pixels outside the head disc are exactly 0 (their rows of M are 0)."""
    v = np.asarray(powers_z, dtype=np.float32) @ m.T
    return v.reshape(*v.shape[:-1], grid, grid)


# ---------------------------------------------------------------------------------------------
# the generator


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _rotation(rng: np.random.Generator, deg_lo: float, deg_hi: float) -> np.ndarray:
    axis = _unit(rng.normal(size=3))
    a = np.deg2rad(rng.uniform(deg_lo, deg_hi))
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + np.sin(a) * k + (1 - np.cos(a)) * k @ k


def _tilt(rng: np.random.Generator, o: np.ndarray, max_deg: float) -> np.ndarray:
    return _rotation(rng, 0.0, max_deg) @ o


def _narrowband(rng, n_series, n, sfreq, f0, bw) -> np.ndarray:
    """Unit-variance band-limited Gaussian noise around ``f0`` (Gaussian spectral envelope)."""
    f = np.fft.rfftfreq(n, 1.0 / sfreq)
    env = np.exp(-0.5 * ((f - f0) / (bw / 2.0)) ** 2)
    spec = np.fft.rfft(rng.normal(size=(n_series, n)), axis=-1) * env
    return np.fft.irfft(spec, n=n, axis=-1) / np.sqrt(2.0 * (env**2).sum() / n)


def _pink(rng, n_series, n, sfreq) -> np.ndarray:
    """Unit-variance 1/f noise (power ∝ 1/f above 1 Hz)."""
    f = np.fft.rfftfreq(n, 1.0 / sfreq)
    env = np.where(f >= 1.0, 1.0 / np.sqrt(np.maximum(f, 1.0)), 0.0)
    spec = np.fft.rfft(rng.normal(size=(n_series, n)), axis=-1) * env
    return np.fft.irfft(spec, n=n, axis=-1) / np.sqrt(2.0 * (env**2).sum() / n)


@dataclass(frozen=True)
class Head:
    """The sphere head model and the volume source space (shared by all subjects)."""

    sphere: object
    src: object
    rr: np.ndarray  # (n_sources, 3) source positions, head frame
    centre: np.ndarray


@lru_cache(maxsize=4)
def head_model(spacing_mm: float) -> Head:
    import mne

    mne.set_log_level("ERROR")
    pos = standard_positions()
    info = mne.create_info(list(pos), 128.0, "eeg")
    info.set_montage(_dig(pos))
    sphere = mne.make_sphere_model("auto", "auto", info)
    src = mne.setup_volume_source_space(sphere=sphere, pos=float(spacing_mm))
    rr = src[0]["rr"][src[0]["vertno"]]
    return Head(sphere, src, rr, np.asarray(sphere["r0"], dtype=np.float64))


def _dig(pos: dict[str, np.ndarray]):
    import mne

    return mne.channels.make_dig_montage(ch_pos=pos, coord_frame="head")


def gain_matrix(head: Head, ch_names: list[str], rotation: np.ndarray) -> np.ndarray:
    """EEG gain (C, 3·n_sources) with the cap rotated by ``rotation`` about the head centre."""
    import mne

    pos = {c: head.centre + rotation @ (p - head.centre)
           for c, p in zip(ch_names, positions_for(ch_names), strict=True)}  # fmt: skip
    info = mne.create_info(ch_names, 128.0, "eeg")
    info.set_montage(_dig(pos))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fwd = mne.make_forward_solution(info, trans=None, src=head.src, bem=head.sphere,
                                        eeg=True, meg=False, verbose=False)  # fmt: skip
    return np.asarray(fwd["sol"]["data"], dtype=np.float64)


def _source_below(head: Head, electrode: str, depth: float = 0.7) -> np.ndarray:
    """Indices of the 4 grid points nearest to the point ``depth`` of the way from the head
    centre to the electrode (a subject picks one of them)."""
    target = head.centre + depth * (standard_positions()[electrode] - head.centre)
    return np.argsort(np.linalg.norm(head.rr - target, axis=1))[:4]


# version 2's fixed shape of the time courses (seconds)
ERD_TAU_S = (
    0.15  # logistic time constant of the desynchronisation's onset and end (10-90 %: 0.66 s)
)
REBOUND_DELAY_S = 0.5  # the β rebound's peak after the desynchronisation's end
REBOUND_WIDTH_S = 0.3  # its Gaussian s.d.
TRIAL_JITTER_S = 0.1  # trial-to-trial s.d. of the onset and the end around the subject's latency
AREA = {
    0: 1,
    1: 0,
    2: 2,
}  # class → motor source that desynchronises: left hand → C4, right → C3, feet → Cz


def subject_latency(cfg: BsrConfig, timing: np.random.Generator) -> float:
    """A subject's delay (s) of the desynchronisation after the cue (and of its end after the
    imagery's end): ``erd_latency_s`` plus a normal of s.d. ``latency_jitter_s``, kept within
    [0.1, 1.5] s."""
    return float(np.clip(cfg.erd_latency_s + cfg.latency_jitter_s * timing.normal(), 0.1, 1.5))


def erd_courses(cfg: BsrConfig, labels: np.ndarray, latency: float,
                timing: np.random.Generator) -> dict[str, np.ndarray]:  # fmt: skip
    """Version 2's power factors over the trial's samples (1: baseline): ``mu`` and ``beta``
    (n_trials, 3 motor sources C3 / C4 / Cz, T) and ``alpha`` (n_trials, 1, T), for the given
    labels and subject latency; the trials' jitters are drawn from ``timing``."""
    t = np.arange(cfg.samples) / cfg.sfreq
    n = len(labels)
    on = cfg.cue_s + latency + TRIAL_JITTER_S * timing.normal(size=(n, 1))
    off = cfg.cue_s + cfg.imagery_s + latency + TRIAL_JITTER_S * timing.normal(size=(n, 1))
    rise = 0.5 * (1 + np.tanh((t - on) / (2 * ERD_TAU_S)))  # logistic, written stably
    fall = 0.5 * (1 + np.tanh((t - off) / (2 * ERD_TAU_S)))
    erd = rise * (1 - fall)  # (n, T): 1 while desynchronised
    rebound = np.exp(-0.5 * ((t - off - REBOUND_DELAY_S) / REBOUND_WIDTH_S) ** 2)
    active = np.zeros((n, 3, 1))
    for i, y in enumerate(labels):
        if int(y) in AREA:
            active[i, AREA[int(y)]] = 1.0
    mu = 1.0 - cfg.suppression * active * erd[:, None, :]
    beta = mu + cfg.beta_rebound * active * rebound[:, None, :]
    alpha = 1.0 + cfg.alpha_boost * (labels == 3)[:, None, None] * erd[:, None, :]
    return {"mu": mu, "beta": beta, "alpha": alpha}


def _subject_trials(cfg: BsrConfig, head: Head, rng: np.random.Generator,
                    labels: np.ndarray,
                    timing: np.random.Generator | None = None) -> np.ndarray:  # fmt: skip
    """EEG (n_trials, 32, T) in volts of one subject for the given class labels (version 2:
    ``timing`` draws the subject's latency and the trials' jitters)."""
    n, sf = cfg.samples, cfg.sfreq
    g = gain_matrix(head, MONTAGE_A, _rotation(rng, 3.0, 5.0))  # (C, 3N)
    ns = g.shape[1] // 3

    def dipole(electrode: str) -> np.ndarray:
        s = int(rng.choice(_source_below(head, electrode)))
        o = _tilt(rng, _unit(head.rr[s] - head.centre), 20.0)
        return g[:, 3 * s : 3 * s + 3] @ o  # (C,)

    motor = np.stack([dipole("C3"), dipole("C4"), dipole("Cz")])  # (3, C)
    occip = np.stack([dipole("O1"), dipole("O2")])  # (2, C)
    alpha_f = rng.uniform(8.5, 11.5)
    # background: every source, random orientation, 1/f: sensor covariance L Lᵀ
    orient = _unit(rng.normal(size=(ns, 3)))
    lead = np.einsum("cnk,nk->cn", g.reshape(g.shape[0], ns, 3), orient)  # (C, N)
    cov = lead @ lead.T / ns
    w, v = np.linalg.eigh(cov)
    mix_bg = v * np.sqrt(np.clip(w, 0, None))
    # amplitude bookkeeping: rhythms' mean-channel RMS is the unit of the other terms
    ref = np.sqrt(((motor**2).sum(0) * 2 + (occip**2).sum(0)).mean())
    mix_bg *= cfg.background_rel * ref / np.sqrt(np.trace(cov) / len(cov))
    amp = float(np.exp(rng.normal(0.0, 0.3)))

    n_tr = len(labels)
    mu = _narrowband(rng, 3 * n_tr, n, sf, 10.0, 2.0).reshape(n_tr, 3, n)
    beta = _narrowband(rng, 3 * n_tr, n, sf, 20.0, 4.0).reshape(n_tr, 3, n)
    alpha = _narrowband(rng, 2 * n_tr, n, sf, alpha_f, 1.5).reshape(n_tr, 2, n)
    if cfg.generator_version == 1:
        # power factors for the whole trial: the moving limb's motor area (class 0 → C4,
        # 1 → C3, 2 → Cz) drops; posterior α rises at rest
        gain_m = np.ones((n_tr, 3))
        for i, y in enumerate(labels):
            if int(y) in AREA:
                gain_m[i, AREA[int(y)]] = np.sqrt(1.0 - cfg.suppression)
        gain_a = np.where(labels == 3, np.sqrt(1.0 + cfg.alpha_boost), 1.0)[:, None]
        sig = np.einsum("tsn,sc->tcn", (mu + 0.7 * beta) * gain_m[:, :, None], motor)
        sig += np.einsum("tsn,sc->tcn", alpha * gain_a[:, :, None], occip)
    else:  # cue-locked time courses of the same effects (amplitude: the power's square root)
        if timing is None:
            raise ValueError("generator version 2 needs the timing stream")
        c = erd_courses(cfg, labels, subject_latency(cfg, timing), timing)
        rhythm = mu * np.sqrt(c["mu"]) + 0.7 * beta * np.sqrt(c["beta"])
        sig = np.einsum("tsn,sc->tcn", rhythm, motor)
        sig += np.einsum("tsn,sc->tcn", alpha * np.sqrt(c["alpha"]), occip)
    sig += np.einsum("cd,tdn->tcn", mix_bg, _pink(rng, n_tr * len(cov), n, sf).reshape(n_tr, -1, n))
    sig += cfg.sensor_noise_rel * ref * rng.normal(size=sig.shape)
    return (sig * amp * (20e-6 / ref)).astype(np.float32)  # ≈ 20 µV rhythms


def generate(cfg: BsrConfig) -> pa.Table:
    """All trials: source subjects (balanced labels, used unlabelled for pretraining and
    labelled only by the EEGNet baseline) and target subjects (``n_target_trials`` per class)."""
    head = head_model(cfg.source_spacing_mm)
    subjects = [("source", i, cfg.n_source_trials // 4) for i in range(cfg.n_source_subjects)]
    subjects += [("target", i, cfg.n_target_trials) for i in range(cfg.n_target_subjects)]
    blocks = []
    for role, i, per_class in subjects:
        stream = [cfg.data_seed, 0 if role == "source" else 1, i]
        rng = np.random.default_rng(stream)
        timing = np.random.default_rng([*stream, 2])  # version 2's latencies and jitters
        labels = rng.permutation(np.repeat(np.arange(4), per_class))
        eeg = _subject_trials(cfg, head, rng, labels, timing)
        blocks.append((f"{role[0]}{i:03d}", role, eeg, labels))
    return trials_table(blocks)


def trials_table(blocks: list[tuple[str, str, np.ndarray, np.ndarray]]) -> pa.Table:
    """The trials table (one row per trial) of (subject name, role, eeg (n, C, T), labels)."""
    rows: dict[str, list] = {"subject": [], "role": [], "trial": [], "label": [], "eeg": []}
    for name, role, eeg, labels in blocks:
        for t in range(len(labels)):
            rows["subject"].append(name)
            rows["role"].append(role)
            rows["trial"].append(t)
            rows["label"].append(int(labels[t]))
            rows["eeg"].append(np.asarray(eeg[t]).ravel())
    return pa.table({
        "subject": pa.array(rows["subject"], pa.string()),
        "role": pa.array(rows["role"], pa.string()),
        "trial": pa.array(rows["trial"], pa.int32()),
        "label": pa.array(rows["label"], pa.int8()),
        "eeg": pa.array(rows["eeg"], pa.list_(pa.float32())),
    })  # fmt: skip


# ---------------------------------------------------------------------------------------------
# real EEG: PhysioNet's EEG Motor Movement/Imagery dataset (eegbci), read from its EDF files

# imagery runs: T1 / T2 of each (T0 is rest in every run; "both fists" is not a class here)
EEGBCI_RUNS = {4: ("left_hand", "right_hand"), 8: ("left_hand", "right_hand"),
               12: ("left_hand", "right_hand"), 6: (None, "feet"), 10: (None, "feet"),
               14: (None, "feet")}  # fmt: skip
# recorded at another rate or with other annotations than the rest: left out, as is customary
EEGBCI_EXCLUDED = (88, 89, 92, 100, 104)
EEGBCI_MNE_FOLDER = ("MNE-eegbci-data", "files", "eegmmidb", "1.0.0")


def eegbci_subjects(cfg: BsrConfig) -> tuple[list[int], list[int]]:
    """PhysioNet subject numbers: the first ``n_source_subjects`` usable ones are the source
    subjects, the next ``n_target_subjects`` the targets."""
    ids = [i for i in range(1, 110) if i not in EEGBCI_EXCLUDED]
    n = cfg.n_source_subjects + cfg.n_target_subjects
    if n > len(ids):
        raise NshotError(
            f"field 'n_source_subjects': eegbci has {len(ids)} usable subjects, "
            f"n_source_subjects + n_target_subjects asks for {n}"
        )
    return ids[: cfg.n_source_subjects], ids[cfg.n_source_subjects : n]


def eegbci_checksums() -> dict[str, str]:
    """sha256 of every eegbci file, from the registry that ships with MNE."""
    from importlib.resources import files

    text = files("mne").joinpath("data", "eegbci_checksums.txt").read_text()
    return dict(line.split()[:2] for line in text.splitlines() if line.strip())


def eegbci_files(cfg: BsrConfig, subjects: list[int]) -> dict[tuple[int, int], Path]:
    """The EDF file of every (subject, imagery run), found under ``data_path`` (or downloaded
    into the cache with ``fetch_data``) and checked against MNE's checksums."""
    runs = sorted(EEGBCI_RUNS)
    if cfg.data_path is not None:
        root = Path(cfg.data_path).expanduser()
    else:  # fetch_data (the config requires one of the two)
        from mne.datasets import eegbci

        root = cache_dir() / "eegbci"
        eegbci.load_data(subjects, runs, path=str(root), update_path=False, verbose="error")
    bases = [root, root.joinpath(*EEGBCI_MNE_FOLDER)]
    sums = eegbci_checksums()
    out: dict[tuple[int, int], Path] = {}
    for subj in subjects:
        for run in runs:
            rel = f"S{subj:03d}/S{subj:03d}R{run:02d}.edf"
            path = next((b / rel for b in bases if (b / rel).is_file()), None)
            if path is None:
                raise NshotError(
                    f"field 'data_path': {rel} is not under {root} (nor under "
                    f"{'/'.join(EEGBCI_MNE_FOLDER)} there); fetch_data=true downloads it"
                )
            if sha256_file(path) != sums.get(rel):
                raise NshotError(
                    f"field 'data_path': {path} differs from PhysioNet's file (its sha256 is not "
                    "the one MNE lists): a partial download or another file"
                )
            out[(subj, run)] = path
    return out


def eegbci_trials(cfg: BsrConfig, files: dict[int, Path]) -> dict[str, list[np.ndarray]]:
    """One subject's trials per class: montage A's channels (µV), band-passed 1–40 Hz,
    resampled to ``sfreq``, ``trial_s`` from each cue's onset (``files``: run → EDF)."""
    import mne
    from mne.datasets import eegbci

    per: dict[str, list[np.ndarray]] = {c: [] for c in CLASSES}
    for run, path in sorted(files.items()):
        raw = mne.io.read_raw_edf(path, preload=True, verbose="error")
        eegbci.standardize(raw)
        if missing := [c for c in MONTAGE_A if c not in raw.ch_names]:
            raise NshotError(f"{path}: no channel {missing[0]} (montage A needs {MONTAGE_A})")
        raw.pick(MONTAGE_A)
        raw.filter(1.0, 40.0, verbose="error")
        raw.resample(cfg.sfreq, verbose="error")
        data = raw.get_data(picks=MONTAGE_A) * 1e6  # V → µV
        t1, t2 = EEGBCI_RUNS[run]
        names = {"T0": "rest", "T1": t1, "T2": t2}
        for onset, desc in zip(raw.annotations.onset, raw.annotations.description, strict=True):
            cls = names.get(str(desc).strip())
            start = int(round(float(onset) * cfg.sfreq))
            if cls is not None and start + cfg.samples <= data.shape[1]:
                per[cls].append(data[:, start : start + cfg.samples].astype(np.float32))
    return per


def read_eegbci(cfg: BsrConfig) -> pa.Table:
    """The eegbci trials in the generated table's layout: per subject, the same number of
    trials of each class (the fewest it has, at most ``n_source_trials / 4`` for a source and
    ``n_target_trials`` for a target subject), drawn by ``data_seed``."""
    sources, targets = eegbci_subjects(cfg)
    files = eegbci_files(cfg, sources + targets)
    blocks = []
    for role, ids, cap in (("source", sources, cfg.n_source_trials // 4),
                           ("target", targets, cfg.n_target_trials)):  # fmt: skip
        for subj in ids:
            per = eegbci_trials(cfg, {r: files[(subj, r)] for r in EEGBCI_RUNS})
            n = min(cap, *(len(v) for v in per.values()))
            if n == 0:
                rare = min(per, key=lambda c: len(per[c]))
                raise NshotError(f"S{subj:03d}: no {rare} trial of {cfg.trial_s} s in its runs")
            if role == "target" and n <= max(cfg.shots):
                raise NshotError(
                    f"S{subj:03d}: {n} trials of its rarest class, too few for k = "
                    f"{max(cfg.shots)} shots and a query (field 'shots')"
                )
            rng = np.random.default_rng([cfg.data_seed, subj])
            eeg, labels = [], []
            for c, cls in enumerate(CLASSES):
                pick = np.sort(rng.choice(len(per[cls]), size=n, replace=False))
                eeg += [per[cls][i] for i in pick]
                labels += [c] * n
            order = rng.permutation(len(labels))
            blocks.append((f"{role[0]}S{subj:03d}", role, np.stack(eeg)[order],
                           np.asarray(labels)[order]))  # fmt: skip
    return trials_table(blocks)


def eeg_table(cfg: BsrConfig) -> pa.Table:
    """The trials (generated, or eegbci's), built once and cached as verified Parquet under
    ``$NSHOT_CACHE``."""
    key = json.dumps(cfg.data_key(), sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    if cfg.dataset == "eegbci":
        return cached_table(f"bsr-eegbci-{digest}", lambda: read_eegbci(cfg),
                            version=DATA_VERSION)  # fmt: skip
    return cached_table(f"bsr-eeg-{digest}", lambda: generate(cfg), version=DATA_VERSION)


@dataclass
class Dataset:
    """Trials as arrays: eeg (n, 32, T) on montage A, labels (n,), subject names (n,), roles."""

    eeg: np.ndarray
    labels: np.ndarray
    subjects: np.ndarray
    roles: np.ndarray
    sfreq: float

    def subject(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        sel = self.subjects == name
        return self.eeg[sel], self.labels[sel]

    def names(self, role: str) -> list[str]:
        return sorted(set(self.subjects[self.roles == role].tolist()))


# the last dataset this process loaded: a Ray worker runs many jobs on the same trials
_LOADED: dict[str, Dataset] = {}


def load_dataset(cfg: BsrConfig) -> Dataset:
    """The trials as read-only arrays (read from the cache once per process and data key)."""
    key = json.dumps([str(cache_dir()), cfg.data_path, cfg.data_key()], sort_keys=True)
    if key in _LOADED:
        return _LOADED[key]
    t = eeg_table(cfg)
    flat = t.column("eeg").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    ds = Dataset(
        eeg=flat.reshape(t.num_rows, len(MONTAGE_A), cfg.samples),
        labels=t.column("label").to_numpy().astype(np.int64),
        subjects=np.asarray(t.column("subject").to_pylist()),
        roles=np.asarray(t.column("role").to_pylist()),
        sfreq=cfg.sfreq,
    )
    for a in (ds.eeg, ds.labels, ds.subjects, ds.roles):
        a.flags.writeable = False
    _LOADED.clear()
    _LOADED[key] = ds
    return ds


def montage_channels(montage: str) -> np.ndarray:
    """Indices into montage A's channels of a montage's channels."""
    return np.array([MONTAGE_A.index(c) for c in MONTAGES[montage]])


def montage_xy(montage: str, scramble_seed: int | None = None) -> np.ndarray:
    """Disc coordinates of a montage's electrodes; with ``scramble_seed`` the positions are
    permuted among the channels (the negative control: the topology is destroyed)."""
    xy = project(positions_for(MONTAGES[montage]))
    if scramble_seed is not None:
        xy = xy[np.random.default_rng([scramble_seed, len(xy)]).permutation(len(xy))]
    return xy
