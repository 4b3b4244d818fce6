"""ℓ∞ attacks in pixel space (images in [0, 1], before the model's own normalisation).

* :func:`pgd`: projected gradient ascent with a uniform random start in [−ε, ε] (Madry et al.
  2018), the step's sign, and projection onto the ε-ball and [0, 1] after every step;
* :func:`apgd_ce`: APGD with the cross-entropy loss (Croce & Hein 2020, Algorithm 1: step size
  2ε halved on oscillation or stagnation at the checkpoints p_j, momentum 0.75, the best
  point kept), as AutoAttack's ``apgd-ce`` and torchattacks' ``APGD(loss="ce")`` run it.

``loss_fn(x_adv) -> per-example losses [B]`` is maximised; ``model(x) -> logits``. The random
starts are drawn on the CPU (``generator``) and moved to the images' device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor], torch.Tensor]


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """Onto the ℓ∞ ball of radius ``eps`` around ``x``, then onto [0, 1]."""
    return torch.minimum(torch.maximum(x_adv, x - eps), x + eps).clamp(0.0, 1.0)


def pgd(
    loss_fn: LossFn,
    x: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """PGD-``steps`` maximising ``loss_fn`` from a uniform random start (detached result)."""
    x = x.detach()
    if eps <= 0 or steps <= 0:
        return x.clone()
    delta = (torch.rand(x.shape, generator=generator, dtype=x.dtype).to(x.device) * 2 - 1) * eps
    x_adv = project(x + delta, x, eps)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        loss = loss_fn(x_adv).sum()
        (grad,) = torch.autograd.grad(loss, x_adv)
        x_adv = project(x_adv.detach() + step_size * grad.sign(), x, eps)
    return x_adv.detach()


def ce_loss(model: Callable[[torch.Tensor], torch.Tensor], y: torch.Tensor) -> LossFn:
    """Cross-entropy of ``model``'s logits, in float64: at a logit gap above about 17 float32's
    softmax rounds the true class's probability to 1, its gradient term vanishes and the sign
    step follows the other classes' terms alone (the gaps reach 28 at s = 100 on the tiny
    CLIP)."""
    return lambda z: F.cross_entropy(model(z).double(), y, reduction="none")


def _checkpoints(steps: int) -> list[int]:
    """APGD's iterations where the step size is reconsidered: p_0 = 0, p_1 = 0.22,
    p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06), times ``steps``."""
    p = [0.0, 0.22]
    while p[-1] < 1:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    return sorted({int(round(q * steps)) for q in p[1:] if q < 1})


def apgd_ce(
    model: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    steps: int = 100,
    rho: float = 0.75,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """APGD-CE (ℓ∞): the adversarial examples (the first misclassified point found per
    example, else the highest-loss one)."""
    x = x.detach()
    n = len(x)
    shape = (n,) + (1,) * (x.dim() - 1)
    t = torch.rand(x.shape, generator=generator, dtype=x.dtype).to(x.device) * 2 - 1
    t = t / t.reshape(n, -1).abs().amax(1).clamp_min(1e-12).view(shape)
    x_adv = project(x + eps * t, x, eps)

    def loss_grad(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = z.clone().requires_grad_(True)
        logits = model(z)
        loss = F.cross_entropy(logits.double(), y, reduction="none")  # float64: see ce_loss
        (g,) = torch.autograd.grad(loss.sum(), z)
        return loss.detach(), g.detach(), logits.detach()

    loss, grad, logits = loss_grad(x_adv)
    wrong = logits.argmax(-1) != y
    x_out = x_adv.clone()  # misclassified points, else the best
    found = wrong.clone()
    x_best, loss_best, grad_best = x_adv.clone(), loss.clone(), grad.clone()
    step = torch.full(shape, 2.0 * eps, dtype=x.dtype, device=x.device)
    checks = set(_checkpoints(steps))
    last_check = 0
    loss_at_check = loss_best.clone()
    reduced_at_check = torch.zeros(n, dtype=torch.bool, device=x.device)
    increases = torch.zeros(
        n, device=x.device
    )  # iterations since the last check where the loss increased
    prev_loss = loss.clone()
    x_prev = x_adv.clone()
    for i in range(steps):
        a = 1.0 if i == 0 else rho
        z = project(x_adv + step * grad.sign(), x, eps)
        z = project(x_adv + a * (z - x_adv) + (1 - a) * (x_adv - x_prev), x, eps)
        x_prev, x_adv = x_adv, z
        loss, grad, logits = loss_grad(x_adv)
        wrong = logits.argmax(-1) != y
        new = wrong & ~found
        x_out[new] = x_adv[new]
        found |= wrong
        increases += (loss > prev_loss).to(increases.dtype)
        prev_loss = loss
        better = loss > loss_best
        x_best[better], loss_best[better], grad_best[better] = (
            x_adv[better],
            loss[better],
            grad[better],
        )
        if i + 1 in checks:
            k = i + 1 - last_check
            oscillating = increases <= k * rho
            stalled = ~reduced_at_check & (loss_at_check >= loss_best)
            halve = oscillating | stalled
            step[halve] /= 2.0
            x_adv[halve] = x_best[halve]
            grad[halve] = grad_best[halve]
            reduced_at_check = halve
            loss_at_check = loss_best.clone()
            increases.zero_()
            last_check = i + 1
    x_out[~found] = x_best[~found]
    return x_out.detach()
