"""The metrics of the reproduction (paper §4; the standard evaluators of this literature).

* ``disc`` (↓): |accuracy − 0.5| of a post-hoc 2-layer GRU trained to tell real from generated
  windows, on windows it did not train on: one 80/20 split of an equal mix, or (``folds`` ≥ 2)
  k-fold cross-validation with the accuracy pooled over every window; mean over classifier
  seeds.
* ``fid_feat`` (↓): Fréchet distance between Gaussian fits of 24 fixed features of real and
  generated windows: autocorrelation at lags 1–10, FFT magnitudes of bins 1–8, mean and std of
  the window, autocorrelation at lags 1–3 and std of its first differences.
* ``pred`` (↓): train-on-synthetic-test-on-real; a 1-layer GRU trained on generated windows to
  predict x_{t+1} from x_{≤t}, its MAE on the real windows.
* ``routing_js`` (↑): per pre-training domain, the mean top-k gate distribution over its tokens at
  t ∈ [T/4, 3T/4]; the mean pairwise Jensen–Shannon divergence (base 2), averaged over layers.

Windows enter every metric in the scaled units of the target's few-shot scaler.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy import linalg
from torch import nn

from .model import Denoiser, Diffusion


class _GRU(nn.Module):
    def __init__(self, channels: int, hidden: int, layers: int, out: int) -> None:
        super().__init__()
        self.gru = nn.GRU(channels, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x)[0])


def disc_score(
    real: np.ndarray, fake: np.ndarray, *, iters: int, batch: int, seeds: int, seed: int = 0,
    folds: int = 1, lr: float = 1e-3,
) -> float:  # fmt: skip
    """|acc − 0.5| of a 2-layer GRU (hidden max(C, 4)·3, Adam at ``lr``) on windows it did not train
    on, mean over ``seeds``. Each seed draws n = min(#real, #fake) windows of each kind.
    ``folds`` = 1: one GRU trained on 80 % of them, accuracy on the other 20 %; ``folds`` = k ≥ 2:
    k-fold cross-validation, k GRUs, the accuracy pooled over all 2n held-out predictions (every
    window is tested once, so the accuracy's sampling error is that of 2n windows, not 0.4n)."""
    c = real.shape[-1]
    scores = []
    for s in range(seeds):
        rng = np.random.default_rng([seed, 505, s])
        n = min(len(real), len(fake))
        x = np.concatenate([real[rng.choice(len(real), n, replace=False)],
                            fake[rng.choice(len(fake), n, replace=False)]])  # fmt: skip
        y = np.r_[np.ones(n), np.zeros(n)].astype(np.float32)
        order = rng.permutation(2 * n)
        if folds == 1:
            cut = int(0.8 * 2 * n)
            splits = [(order[:cut], order[cut:])]
        else:
            parts = np.array_split(order, folds)
            splits = [(np.concatenate(parts[:i] + parts[i + 1 :]), parts[i])
                      for i in range(folds)]  # fmt: skip
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        right = tested = 0
        for tr, te in splits:
            torch.manual_seed(int(rng.integers(2**31)))
            model = _GRU(c, max(c, 4) * 3, 2, 1)
            opt = torch.optim.Adam(model.parameters(), lr)
            for _ in range(iters):
                idx = torch.from_numpy(rng.choice(tr, min(batch, len(tr)), replace=False))
                logit = model(xt[idx])[:, -1, 0]
                loss = nn.functional.binary_cross_entropy_with_logits(logit, yt[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            with torch.no_grad():
                right += int(((model(xt[te])[:, -1, 0] > 0).float() == yt[te]).sum())
                tested += len(te)
        scores.append(abs(right / tested - 0.5))
    return float(np.mean(scores))


def features(x: np.ndarray) -> np.ndarray:
    """24 features per window (first channel): ACF lags 1–10, |FFT| bins 1–8, mean, std of the
    window, and ACF lags 1–3 and std of its first differences Δx (the step-to-step dynamics:
    the window's own ACF and low-frequency spectrum are dominated by its overall shape)."""
    v = x[..., 0].astype(np.float64)
    m = v.mean(1, keepdims=True)
    c = v - m
    var = (c**2).sum(1) + 1e-12
    acf = np.stack([(c[:, k:] * c[:, :-k]).sum(1) / var for k in range(1, 11)], 1)
    fft = np.abs(np.fft.rfft(c, axis=1))[:, 1:9] / v.shape[1]
    d = np.diff(v, axis=1)
    dc = d - d.mean(1, keepdims=True)
    dvar = (dc**2).sum(1) + 1e-12
    dacf = np.stack([(dc[:, k:] * dc[:, :-k]).sum(1) / dvar for k in range(1, 4)], 1)
    return np.concatenate([acf, fft, m, v.std(1, keepdims=True), dacf,
                           d.std(1, keepdims=True)], 1)  # fmt: skip


def roughness(x: np.ndarray) -> dict[str, float]:
    """Step-to-step statistics of windows (first channel), for telling a rough generator from a
    smooth one: the mean over windows of the std of the first differences Δx relative to the
    window's own std (``dx_ratio``; white noise has √2, a smooth curve much less), the lag-1
    autocorrelation of Δx (``dx_acf1``: about −0.5 for white noise, above 0 for smooth series)
    and the share of the window's variance above half the Nyquist frequency (``hf_share``)."""
    v = x[..., 0].astype(np.float64)
    c = v - v.mean(1, keepdims=True)
    sd = c.std(1) + 1e-12
    d = np.diff(v, axis=1)
    dc = d - d.mean(1, keepdims=True)
    acf1 = (dc[:, 1:] * dc[:, :-1]).sum(1) / ((dc**2).sum(1) + 1e-12)
    power = np.abs(np.fft.rfft(c, axis=1)) ** 2
    half = power.shape[1] // 2
    hf = power[:, half:].sum(1) / (power[:, 1:].sum(1) + 1e-12)
    return {
        "dx_ratio": float(np.mean(d.std(1) / sd)),
        "dx_acf1": float(np.mean(acf1)),
        "hf_share": float(np.mean(hf)),
    }


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean, _ = linalg.sqrtm(s1 @ s2, disp=False)
    covmean = np.real(covmean)
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * covmean))


def fid_feat(real: np.ndarray, fake: np.ndarray) -> float:
    return frechet(features(real), features(fake))


def pred_score(real: np.ndarray, fake: np.ndarray, *, iters: int, batch: int, seed: int) -> float:
    """TSTR one-step MAE of a 1-layer GRU trained on ``fake``, on ``real``."""
    c = real.shape[-1]
    torch.manual_seed(seed + 606)
    rng = np.random.default_rng([seed, 606])
    model = _GRU(c, max(c, 4) * 3, 1, c)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    xf = torch.from_numpy(fake)
    for _ in range(iters):
        idx = torch.from_numpy(rng.choice(len(fake), min(batch, len(fake)), replace=False))
        xb = xf[idx]
        loss = (model(xb[:, :-1]) - xb[:, 1:]).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        xr = torch.from_numpy(real)
        return float((model(xr[:, :-1]) - xr[:, 1:]).abs().mean())


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon divergence in bits (0 … 1)."""
    p, q = p / p.sum(), q / q.sum()
    m = 0.5 * (p + q)

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        keep = a > 0
        return float((a[keep] * np.log2(a[keep] / b[keep])).sum())

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


@torch.no_grad()
def routing_distributions(
    net: Denoiser, diffusion: Diffusion, domains: list[np.ndarray], n: int, seed: int
) -> np.ndarray | None:
    """(layers, domains, K): per domain the mean gate distribution over its tokens; None for a
    model without a router."""
    rng = np.random.default_rng([seed, 707])
    out = []
    for w in domains:
        a = rng.integers(len(w), size=n)
        b = (a + 1 + rng.integers(max(len(w) - 1, 1), size=n)) % len(w)
        x0, ex = torch.from_numpy(w[a]), torch.from_numpy(w[b])
        lo, hi = diffusion.T // 4, max(3 * diffusion.T // 4, diffusion.T // 4 + 1)
        t = torch.from_numpy(rng.integers(lo, hi, size=n))
        eps = torch.from_numpy(rng.standard_normal(x0.shape).astype(np.float32))
        res = net(diffusion.q_sample(x0, t, eps), t, ex)
        if not res.routings:
            return None
        out.append([r.gates.mean(dim=(0, 1)).numpy() for r in res.routings])
    return np.asarray(out).transpose(1, 0, 2)


def routing_js(dist: np.ndarray | None) -> float | None:
    """Mean pairwise JS divergence across domains, averaged over layers."""
    if dist is None:
        return None
    vals = [np.mean([js_divergence(layer[i], layer[j])
                     for i, j in itertools.combinations(range(len(layer)), 2)])
            for layer in dist]  # fmt: skip
    return float(np.mean(vals))


def score_windows(
    real: np.ndarray, fake: np.ndarray, *, iters: int, batch: int, seeds: int, pred_iters: int,
    seed: int, folds: int = 1, lr: float = 1e-3, pred_batch: int = 64,
) -> dict[str, float]:  # fmt: skip
    """disc (``iters``, ``batch``, ``seeds``, ``folds``, ``lr``), fid_feat and pred (a batch of
    ``pred_batch`` generated windows per TSTR step)."""
    return {
        "disc": disc_score(
            real, fake, iters=iters, batch=batch, seeds=seeds, seed=seed, folds=folds, lr=lr
        ),  # fmt: skip
        "fid_feat": fid_feat(real, fake),
        "pred": pred_score(real, fake, iters=pred_iters, batch=pred_batch, seed=seed),
    }
