"""UCAT's Dirichlet read-outs of CLIP's logits, the Dirichlet KL, and the calibration metrics.

Training (paper §3): the logits ``ℓ = s·cos`` become the concentrations
``α = exp((ℓ/s + 1)/τ') + 1e-6`` (so α ∈ [1, e^{2/τ'}]); the loss adds
``λ · KL(Dir(α_adv) ‖ Dir(α_ori))`` with ``λ = tau / exp(softplus(2/τ'))``. α reaches e^{28.6}
at τ' = 0.07, beyond float16 (e^{11}) and beyond float32's precision for lnΓ(α₀): both are
computed in float64 whatever the input dtype.

Evaluation (the authors' released code; a different α): ``α = exp(softplus(ℓ)) + 1e-6``;
aleatoric ``AU`` (expected entropy of the categorical under the Dirichlet, ÷ ln C), the
paper's epistemic ``EU = C / (α₀ + C)``, the code's variant ``eu_code = C / logsumexp(α + 1)
/ ln C`` and the predictive entropy ``PU`` of the softmax (÷ ln C).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ALPHA_EPS = 1e-6


def lambda_of(tau: float, tau_prime: float) -> float:
    """The KL weight λ = tau / exp(softplus(2/τ')) (the released code's scaling; ≈ 3.9e-8 at
    tau = 1e5, τ' = 0.07)."""
    if tau < 0 or tau_prime <= 0:
        raise ValueError("tau must be >= 0 and tau_prime > 0")
    sp = F.softplus(torch.tensor(2.0 / tau_prime, dtype=torch.float64))
    return float(tau / torch.exp(sp))


def alpha_train(logits: torch.Tensor, scale: float, tau_prime: float) -> torch.Tensor:
    """Training concentrations ``exp((ℓ/s + 1)/τ') + 1e-6`` in float64 (``ℓ/s`` is the cosine)."""
    cos = logits.to(torch.float64) / scale
    return torch.exp((cos + 1.0) / tau_prime) + ALPHA_EPS


def alpha_eval(logits: torch.Tensor) -> torch.Tensor:
    """Evaluation concentrations ``exp(softplus(ℓ)) + 1e-6`` in float64 (released code)."""
    return torch.exp(F.softplus(logits.to(torch.float64))) + ALPHA_EPS


def dirichlet_kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KL(Dir(a) ‖ Dir(b)) per row, in float64 (inputs of any float dtype are upcast first):
    lnΓ(a₀) − Σ lnΓ(a_c) − lnΓ(b₀) + Σ lnΓ(b_c) + Σ (a_c − b_c)(ψ(a_c) − ψ(a₀))."""
    a = a.to(torch.float64)
    b = b.to(torch.float64)
    a0 = a.sum(-1)
    b0 = b.sum(-1)
    return (
        torch.lgamma(a0)
        - torch.lgamma(a).sum(-1)
        - torch.lgamma(b0)
        + torch.lgamma(b).sum(-1)
        + ((a - b) * (torch.digamma(a) - torch.digamma(a0)[..., None])).sum(-1)
    )


def uncertainty(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row ``au``, ``eu`` (paper), ``eu_code`` (released code), ``pu`` (softmax entropy ÷
    ln C), ``entropy`` (the same, in nats) and ``alpha0`` of the evaluation α, float64."""
    c = logits.shape[-1]
    ln_c = math.log(c)
    alpha = alpha_eval(logits)
    a0 = alpha.sum(-1)
    mean = alpha / a0[..., None]
    au = -(mean * (torch.digamma(alpha + 1) - torch.digamma(a0 + 1)[..., None])).sum(-1)
    p = torch.softmax(logits.to(torch.float64), -1)
    ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    return {
        "au": au / ln_c,
        "eu": c / (a0 + c),
        "eu_code": c / torch.logsumexp(alpha + 1, -1) / ln_c,
        "pu": ent / ln_c,
        "entropy": ent,
        "alpha0": a0,
    }


def normalised_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Softmax entropy ÷ ln C per row."""
    p = probs.to(torch.float64)
    return -(p * torch.log(p.clamp_min(1e-300))).sum(-1) / math.log(p.shape[-1])


def ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error, L1, over ``n_bins`` equal-width bins of the top-1
    probability (torchmetrics' ``MulticlassCalibrationError`` binning: bins [b_i, b_{i+1}),
    a confidence of exactly 1 in a bin of its own)."""
    if len(labels) == 0:
        return float("nan")
    conf, pred = probs.to(torch.float64).max(-1)
    acc = (pred == labels).to(torch.float64)
    bounds = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    idx = torch.bucketize(conf, bounds, right=True) - 1
    count = torch.zeros(n_bins + 1, dtype=torch.float64).scatter_add_(0, idx, torch.ones_like(conf))
    conf_sum = torch.zeros_like(count).scatter_add_(0, idx, conf)
    acc_sum = torch.zeros_like(count).scatter_add_(0, idx, acc)
    used = count > 0
    gap = (acc_sum[used] - conf_sum[used]).abs()
    return float(gap.sum() / count.sum())
