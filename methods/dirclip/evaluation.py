"""dirclip's metrics: clean and adversarial zero-shot accuracy, calibration and the
uncertainty read-outs, on the test digits, the rolled digits and MNIST pooled to 8 × 8.

* ``clean``, ``pgd`` (PGD-``pgd_steps``, step ``pgd_step``: ε/4 unless set, random start),
  ``apgd`` (APGD-CE, ``apgd_steps`` iterations, on ``apgd_images`` test images), ``h`` =
  harmonic mean of clean and pgd;
* ``ece_clean`` / ``ece_adv``: 15-bin L1 ECE of the softmax on clean / PGD inputs;
* ``ent_ratio``: mean normalised softmax entropy of the wrong PGD predictions over that of the
  wrong clean predictions (< 1: the attack suppresses uncertainty);
* ``clean_rolled``, ``pgd_rolled``, ``clean_mnist8``;
* the Dirichlet read-outs (evaluation α): ``au``, ``eu``, ``eu_code``, ``pu``, clean and
  ``*_adv``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .attacks import apgd_ce, ce_loss, pgd
from .config import DirclipConfig
from .data import Splits
from .dirichlet import ece, normalised_entropy, uncertainty

CHUNK = 1024


@torch.no_grad()
def logits_of(model, x: torch.Tensor) -> torch.Tensor:
    parts = [model.logits(x[i : i + CHUNK]) for i in range(0, len(x), CHUNK)]
    return torch.cat(parts) if parts else torch.zeros(0, len(model.class_names))


def attack_pgd(model, x, y, cfg: DirclipConfig, steps: int, generator) -> torch.Tensor:
    step = cfg.eps / 4 if cfg.pgd_step is None else cfg.pgd_step
    return pgd(ce_loss(model.logits, y), x, cfg.eps, steps, step, generator)


def harmonic(a: float, b: float) -> float:
    return 0.0 if a + b <= 0 else 2 * a * b / (a + b)


def _acc(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(-1) == y).double().mean()) if len(y) else float("nan")


def _wrong_entropy(logits: torch.Tensor, y: torch.Tensor) -> float:
    wrong = logits.argmax(-1) != y
    if not wrong.any():
        return float("nan")
    return float(normalised_entropy(logits[wrong].softmax(-1)).mean())


def logit_metrics(lc: torch.Tensor, la: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy, ECE, the entropy ratio and the Dirichlet read-outs of clean logits ``lc`` and
    adversarial logits ``la`` of the labels ``y``."""
    clean, adv = _acc(lc, y), _acc(la, y)
    out: dict[str, float] = {
        "clean": clean,
        "pgd": adv,
        "h": harmonic(clean, adv),
        "ece_clean": ece(lc.softmax(-1), y),
        "ece_adv": ece(la.softmax(-1), y),
    }
    ent_clean, ent_adv = _wrong_entropy(lc, y), _wrong_entropy(la, y)
    out["ent_wrong_clean"], out["ent_wrong_adv"] = ent_clean, ent_adv
    out["ent_ratio"] = ent_adv / ent_clean if ent_clean > 0 else float("nan")
    for tag, logits in (("", lc), ("_adv", la)):
        u = uncertainty(logits)
        for k in ("au", "eu", "eu_code", "pu"):
            out[f"{k}{tag}"] = float(u[k].mean())
    return out


def validation(model, splits: Splits, cfg: DirclipConfig, step: int) -> dict[str, float]:
    """Clean and PGD-``val_pgd_steps`` accuracy on the held-out training images, and their
    harmonic mean ``val_h`` (the selection criterion)."""
    dev = next(model.parameters()).device  # the held-out images follow the model
    x, y = torch.from_numpy(splits.x_val).to(dev), torch.from_numpy(splits.y_val).to(dev)
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    was = model.training
    model.eval()
    clean = _acc(logits_of(model, x), y)
    adv = _acc(logits_of(model, attack_pgd(model, x, y, cfg, cfg.val_pgd_steps, gen)), y)
    model.train(was)
    return {"val_clean": clean, "val_pgd": adv, "val_h": harmonic(clean, adv)}


def evaluate_model(
    model,
    splits: Splits,
    cfg: DirclipConfig,
    seed: int,
    *,
    shifts: bool = True,
    apgd: bool = True,
    apgd_offset: int = 0,
) -> dict[str, float]:
    """Every metric of one model. ``apgd_offset``: the first test image of the APGD subset
    (the reproduction gives each seed its own images)."""
    model.eval()
    gen = torch.Generator().manual_seed(10_007 * seed + 1)
    x, y = torch.from_numpy(splits.x_test), torch.from_numpy(splits.y_test)
    lc = logits_of(model, x)
    xa = attack_pgd(model, x, y, cfg, cfg.pgd_steps, gen)
    la = logits_of(model, xa)
    out = logit_metrics(lc, la, y)
    if apgd:
        n = min(cfg.apgd_images, len(y))
        idx = (apgd_offset + np.arange(n)) % len(y)
        xs, ys = x[idx], y[idx]
        gen_a = torch.Generator().manual_seed(10_007 * seed + 2)
        xa2 = apgd_ce(model.logits, xs, ys, cfg.eps, cfg.apgd_steps, generator=gen_a)
        out["apgd"] = _acc(logits_of(model, xa2), ys)
        out["pgd_on_apgd_images"] = float((la[idx].argmax(-1) == ys).double().mean())
    if shifts:
        xr = torch.from_numpy(splits.x_rolled)
        out["clean_rolled"] = _acc(logits_of(model, xr), y)
        gen_r = torch.Generator().manual_seed(10_007 * seed + 3)
        out["pgd_rolled"] = _acc(
            logits_of(model, attack_pgd(model, xr, y, cfg, cfg.pgd_steps, gen_r)), y
        )
        xm, ym = torch.from_numpy(splits.x_mnist8), torch.from_numpy(splits.y_mnist8)
        out["clean_mnist8"] = _acc(logits_of(model, xm), ym)
    return {k: float(v) for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}
