"""bsr's real-EEG reader (dataset eegbci) on EDF files written in PhysioNet's layout and
channel labels: classes from the cue annotations of the imagery runs, balanced per subject,
checksums, missing files and the config's refusal without a source of files. The files are
small stand-ins (no download in tests): every cue's segment is a 10 Hz sine whose amplitude
says which run kind and cue it came from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nshot.errors import ConfigError, NshotError
from nshot.hashing import sha256_file
from nshot.methods.bsr import data as bsr_data
from nshot.methods.bsr.config import BsrConfig

pytest.importorskip("edfio")  # mne.export writes EDF through it (the test extra)

CUES = ("T0", "T1", "T2")
SFREQ = 160.0  # eegbci's rate


def _amp_uv(cue: str, feet_run: bool) -> float:
    return 10.0 * (1 + CUES.index(cue) + (3 if feet_run else 0))


def _label(c: str) -> str:  # PhysioNet's labels: "Fc5.", "Cz..", "Fp1."
    s = c[0] + c[1:].lower()
    return (s + "...")[:4] if len(s) < 4 else s


def _write_subject(root: Path, subj: int, cues_per_run: int = 6) -> None:
    import mne

    names = [_label(c) for c in bsr_data.MONTAGE_A] + ["Fcz."]  # one channel montage A lacks
    for run, (_, t2) in bsr_data.EEGBCI_RUNS.items():
        n = int(SFREQ * (cues_per_run * 4.2 + 1))
        t = np.arange(n) / SFREQ
        x = np.zeros((len(names), n))
        onsets, cues = [], []
        for i in range(cues_per_run):
            cue, on = CUES[i % 3], 0.5 + 4.2 * i
            sel = (t >= on) & (t < on + 4.2)
            x[:, sel] = _amp_uv(cue, t2 == "feet") * 1e-6 * np.sin(2 * np.pi * 10 * t[sel])
            onsets.append(on)
            cues.append(cue)
        raw = mne.io.RawArray(x, mne.create_info(names, SFREQ, "eeg"), verbose="error")
        raw.set_annotations(mne.Annotations(onsets, [4.1] * cues_per_run, cues))
        path = root / f"S{subj:03d}" / f"S{subj:03d}R{run:02d}.edf"
        path.parent.mkdir(parents=True, exist_ok=True)
        mne.export.export_raw(path, raw, fmt="edf", overwrite=True, verbose="error")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eegbci")
    for subj in (1, 2):
        _write_subject(root, subj)
    return root


def _cfg(root: Path, **kw) -> BsrConfig:
    base = dict(dataset="eegbci", data_path=str(root), n_source_subjects=1,
                n_target_subjects=1, n_source_trials=8, n_target_trials=3, shots=[1])  # fmt: skip
    return BsrConfig.from_preset("smoke", **{**base, **kw})


def test_trials_follow_the_cues_of_the_imagery_runs(files, monkeypatch):
    sums = {str(p.relative_to(files)): sha256_file(p) for p in files.rglob("*.edf")}
    monkeypatch.setattr(bsr_data, "eegbci_checksums", lambda: sums)
    cfg = _cfg(files)
    ds = bsr_data.load_dataset(cfg)
    assert ds.names("source") == ["sS001"] and ds.names("target") == ["tS002"]
    assert ds.eeg.shape == (8 + 12, len(bsr_data.MONTAGE_A), cfg.samples)
    for name, per_class in (("sS001", 2), ("tS002", 3)):
        _, labels = ds.subject(name)
        assert np.bincount(labels, minlength=4).tolist() == [per_class] * 4
    # each trial's 10 Hz amplitude (µV, after the 1-40 Hz band-pass) names its run kind and cue
    amp = np.sqrt(2) * ds.eeg[:, :, cfg.samples // 4 :].std(-1).mean(-1)
    want = {"left_hand": [_amp_uv("T1", False)], "right_hand": [_amp_uv("T2", False)],
            "feet": [_amp_uv("T2", True)], "rest": [_amp_uv("T0", False), _amp_uv("T0", True)]}  # fmt: skip
    for a, label in zip(amp, ds.labels, strict=True):
        got = min(want[bsr_data.CLASSES[label]], key=lambda w: abs(w - a))
        assert abs(a - got) < 0.1 * got, (bsr_data.CLASSES[label], a)
    # the feet runs' T1 (both fists) is no class
    assert not np.any(np.abs(amp - _amp_uv("T1", True)) < 5.0)


def test_files_are_checked_and_a_source_of_files_is_required(files, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="data_path"):
        BsrConfig.from_preset("smoke", dataset="eegbci")
    sums = {str(p.relative_to(files)): sha256_file(p) for p in files.rglob("*.edf")}
    sums["S002/S002R10.edf"] = "0" * 64
    monkeypatch.setattr(bsr_data, "eegbci_checksums", lambda: sums)
    with pytest.raises(NshotError, match=r"S002R10.edf differs from PhysioNet's file"):
        bsr_data.eegbci_files(_cfg(files), [1, 2])
    (tmp_path / "S001").mkdir()
    with pytest.raises(NshotError, match=r"field 'data_path': S001/S001R04.edf is not under"):
        bsr_data.eegbci_files(_cfg(tmp_path), [1])
    with pytest.raises(NshotError, match="usable subjects"):
        bsr_data.eegbci_subjects(_cfg(files, n_source_subjects=100, n_target_subjects=10))
