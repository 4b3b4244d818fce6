"""The baselines that are not TimeMoDE variants (paper §4 compares against this literature).

* ``timevae``: a small TimeVAE (Desai et al. 2021): a conv encoder to a Gaussian latent, a
  decoder that sums a level, a polynomial trend (degree 2) and a residual conv block; ELBO with
  the reconstruction weighted as in TimeVAE; trained on the scaled few-shot windows.
* ``ar_sim``: statsmodels ``AutoReg`` (order by AIC, at most 4) fitted on the concatenated
  few-shot windows, windows simulated by its recursion from a random few-shot window's first
  values with Gaussian residuals of its estimated variance.
* ``marginal_noise`` (negative control): independent Gaussian noise per time step with the
  few-shot windows' per-step mean and std; no temporal structure.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class TimeVAE(nn.Module):
    def __init__(self, length: int, channels: int = 1, hidden: int = 32, latent: int = 8) -> None:
        super().__init__()
        self.length, self.channels = length, channels
        self.enc = nn.Sequential(
            nn.Conv1d(channels, hidden, 3, padding=1), nn.ReLU(),
            nn.Conv1d(hidden, hidden, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
        )  # fmt: skip
        flat = hidden * ((length + 1) // 2)
        self.mu, self.logvar = nn.Linear(flat, latent), nn.Linear(flat, latent)
        self.level = nn.Linear(latent, channels)
        self.trend = nn.Linear(latent, 2 * channels)
        self.res = nn.Sequential(
            nn.Linear(latent, flat), nn.ReLU(), nn.Linear(flat, length * channels)
        )
        t = torch.arange(length, dtype=torch.float32) / length
        self.register_buffer("poly", torch.stack([t, t**2]))  # (2, L)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        b = z.shape[0]
        level = self.level(z)[:, None, :]
        coef = self.trend(z).reshape(b, self.channels, 2)
        trend = torch.einsum("bcp,pl->blc", coef, self.poly)
        res = self.res(z).reshape(b, self.length, self.channels)
        return level + trend + res

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.enc(x.transpose(1, 2))
        mu, logvar = self.mu(h), self.logvar(h).clamp(-8, 8)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.decode(z), mu, logvar


def timevae_samples(
    shots: np.ndarray, n: int, *, steps: int, seed: int, recon_weight: float = 3.0
) -> np.ndarray:
    """Train a TimeVAE on ``shots`` (scaled, (k, L, C)) and decode ``n`` prior samples."""
    torch.manual_seed(seed + 808)
    model = TimeVAE(shots.shape[1], shots.shape[2])
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    x = torch.from_numpy(shots)
    for _ in range(steps):
        rec, mu, logvar = model(x)
        recon = (rec - x).pow(2).sum(dim=(1, 2)).mean()
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1).mean()
        loss = recon_weight * recon + kl
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        z = torch.randn(n, model.mu.out_features)
        return model.decode(z).numpy().astype(np.float32)


def ar_samples(shots: np.ndarray, n: int, *, seed: int, max_order: int = 4) -> np.ndarray:
    """AutoReg (order by AIC ≤ ``max_order``) on the concatenated first channel of ``shots``."""
    from statsmodels.tsa.ar_model import AutoReg, ar_select_order

    series = shots[..., 0].reshape(-1).astype(np.float64)
    sel = ar_select_order(series, maxlag=max_order, ic="aic", trend="c")
    lags = sel.ar_lags or [1]
    res = AutoReg(series, lags=lags, trend="c").fit()
    p = max(lags)
    const, coefs = float(res.params[0]), np.asarray(res.params[1:], np.float64)
    sigma = float(np.sqrt(res.sigma2))
    rng = np.random.default_rng([seed, 909])
    length = shots.shape[1]
    out = np.empty((n, length))
    starts = rng.integers(len(shots), size=n)
    for i in range(n):
        x = list(shots[starts[i], :p, 0].astype(np.float64))
        while len(x) < length:
            x.append(const + sum(c * x[-lag] for c, lag in zip(coefs, lags, strict=True))
                     + sigma * rng.standard_normal())  # fmt: skip
        out[i] = x[:length]
    return out[..., None].astype(np.float32)


def marginal_noise_samples(shots: np.ndarray, n: int, *, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 1010])
    mu, sd = shots.mean(0), shots.std(0)
    return (mu + sd * rng.standard_normal((n, *shots.shape[1:]))).astype(np.float32)
