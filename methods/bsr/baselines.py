"""The baselines of the reproduction (paper §4 comparisons, reconstructed).

* ``bandpower_lr``: log band power (θ, α, β) per channel, averaged over the trial's frames,
  z-scored with the support's statistics, logistic regression on the support — the
  "spectrum-based" method.
* ``bandpower_frames_lr``: the same log band powers per channel *and frame* (the spectrum
  video's own values before interpolation: F × 3 × C features), z-scored with the support's
  statistics, logistic regression on the support — band power that can read the time course.
* ``riemann_ts_lr``: 4–30 Hz band-passed trials → OAS covariance → tangent space at the
  support's Riemannian mean (pyriemann) → logistic regression.
* ``topomap_cnn``: the time-averaged spectrum frame (3 × H × W, rendered like BSR's videos) with a
  small CNN trained on the support.
* ``eegnet``: the channel-first EEGNet (temporal conv → depthwise spatial conv → separable conv),
  trained supervised on the source subjects' labelled montage-A trials, then fine-tuned on the
  support; on montage B the missing channels are zero-filled (the rigid layout's failure mode).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .config import BsrConfig
from .data import MONTAGE_A, Dataset, montage_channels
from .evaluation import scores, subject_clips, support_split
from .train import raw_powers


def _lr_scores(feat: np.ndarray, labels: np.ndarray, sup: np.ndarray, qry: np.ndarray,
               c: float = 1.0) -> dict:  # fmt: skip
    """Features z-scored with the support's statistics, an L2 logistic regression of inverse
    strength ``c`` fitted on the support; its query scores."""
    from sklearn.linear_model import LogisticRegression

    mu, sd = feat[sup].mean(0), feat[sup].std(0) + 1e-6
    clf = LogisticRegression(max_iter=2000, C=c).fit((feat[sup] - mu) / sd, labels[sup])
    return scores(labels[qry], clf.predict((feat[qry] - mu) / sd))


def bandpower_lr(cfg: BsrConfig, eeg, labels, k: int, montage: str, seed: int) -> dict:
    sup, qry = support_split(labels, k, seed)
    feat = raw_powers(cfg, eeg, montage).mean(1).reshape(len(eeg), -1)
    return _lr_scores(feat, labels, sup, qry, cfg.lr_c)


def bandpower_frames_lr(cfg: BsrConfig, eeg, labels, k: int, montage: str, seed: int) -> dict:
    sup, qry = support_split(labels, k, seed)
    feat = raw_powers(cfg, eeg, montage).reshape(len(eeg), -1)  # (n, F · 3 · C)
    return _lr_scores(feat, labels, sup, qry, cfg.lr_c)


def riemann_ts_lr(cfg: BsrConfig, eeg, labels, k: int, montage: str, seed: int) -> dict:
    from pyriemann.estimation import Covariances
    from pyriemann.tangentspace import TangentSpace
    from scipy.signal import butter, sosfiltfilt

    sup, qry = support_split(labels, k, seed)
    x = eeg if montage == "A" else eeg[:, montage_channels(montage)]
    sos = butter(4, [4.0, 30.0], btype="bandpass", fs=cfg.sfreq, output="sos")
    x = sosfiltfilt(sos, np.asarray(x, np.float64) * 1e6, axis=-1)
    cov = Covariances("oas").fit_transform(x)
    ts = TangentSpace().fit(cov[sup])
    return _lr_scores(ts.transform(cov), labels, sup, qry, cfg.lr_c)


class TopomapCNN(nn.Module):
    def __init__(self, n_classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
            nn.Flatten(), nn.Dropout(0.25), nn.Linear(128, n_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float,
         seed: int, batch: int = 16) -> nn.Module:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-3)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for s in range(0, len(y), batch):
            b = perm[s : s + batch]
            loss = nn.functional.cross_entropy(model(x[b]), y[b], label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return model.eval()


def topomap_cnn(cfg: BsrConfig, eeg, labels, k: int, montage: str, seed: int) -> dict:
    sup, qry = support_split(labels, k, seed)
    clips = subject_clips(cfg, eeg, sup, montage)
    frames = clips.videos(slice(None)).mean(1)  # (n, 3, H, W)
    torch.manual_seed(seed)
    model = _fit(TopomapCNN(), frames[sup], torch.from_numpy(labels[sup]), cfg.topomap_epochs,
                 cfg.topomap_lr, seed)  # fmt: skip
    with torch.no_grad():
        pred = model(frames[qry]).argmax(1).numpy()
    return scores(labels[qry], pred)


class EEGNet(nn.Module):
    """EEGNet-8,2 (Lawhern et al. 2018) for (B, C, T) inputs."""

    def __init__(self, n_channels: int, n_samples: int, sfreq: float, n_classes: int = 4,
                 f1: int = 8, d: int = 2, f2: int = 16, dropout: float = 0.25) -> None:  # fmt: skip
        super().__init__()
        k1 = int(sfreq // 4) | 1  # 0.25 s temporal kernel
        self.features = nn.Sequential(
            nn.Conv2d(1, f1, (1, k1), padding=(0, k1 // 2), bias=False),
            nn.BatchNorm2d(f1),
            nn.Conv2d(f1, f1 * d, (n_channels, 1), groups=f1, bias=False),  # spatial, per filter
            nn.BatchNorm2d(f1 * d), nn.ELU(), nn.AvgPool2d((1, 4)), nn.Dropout(dropout),
            nn.Conv2d(f1 * d, f1 * d, (1, 17), padding=(0, 8), groups=f1 * d, bias=False),
            nn.Conv2d(f1 * d, f2, 1, bias=False),
            nn.BatchNorm2d(f2), nn.ELU(), nn.AvgPool2d((1, 8)), nn.Dropout(dropout),
            nn.Flatten(),
        )  # fmt: skip
        with torch.no_grad():
            n_feat = self.features(torch.zeros(1, 1, n_channels, n_samples)).shape[1]
        self.head = nn.Linear(n_feat, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)))


def _scaled(eeg: np.ndarray, ref: np.ndarray) -> torch.Tensor:
    """Trials scaled by the per-channel std of the reference trials (the subject's own:
    source trials, or the target's support)."""
    sd = ref.std(axis=(0, 2), keepdims=True) + 1e-12
    return torch.from_numpy((eeg / sd).astype(np.float32))


def eegnet_source(cfg: BsrConfig, ds: Dataset, seed: int) -> EEGNet:
    """EEGNet trained on every source subject's labelled montage-A trials."""
    xs, ys = [], []
    for name in ds.names("source"):
        eeg, y = ds.subject(name)
        xs.append(_scaled(eeg, eeg))
        ys.append(torch.from_numpy(y))
    torch.manual_seed(seed)
    model = EEGNet(len(MONTAGE_A), cfg.samples, cfg.sfreq)
    return _fit(model, torch.cat(xs), torch.cat(ys), cfg.eegnet_epochs, 1e-3, seed, batch=32)


def eegnet(cfg: BsrConfig, source: EEGNet, eeg, labels, k: int, montage: str, seed: int) -> dict:
    """Fine-tune a copy of the source EEGNet on the support; montage B's missing channels are
    zero-filled in montage A's layout."""
    import copy

    sup, qry = support_split(labels, k, seed)
    x = eeg.copy()
    if montage != "A":
        keep = np.zeros(len(MONTAGE_A), bool)
        keep[montage_channels(montage)] = True
        x[:, ~keep] = 0.0
    xt = _scaled(x, x[sup])
    model = _fit(copy.deepcopy(source), xt[sup], torch.from_numpy(labels[sup]),
                 cfg.eegnet_ft_epochs, 5e-4, seed, batch=8)  # fmt: skip
    with torch.no_grad():
        pred = model(xt[qry]).argmax(1).numpy()
    return scores(labels[qry], pred)
