"""dirclip's metrics: clean and adversarial zero-shot accuracy, calibration and the
uncertainty read-outs, on the test digits, the rolled digits and MNIST pooled to 8 × 8 (or on
the evaluation images of a real CLIP's image folders, ``chunk`` images at a time: the splits'
``chunk``).

* ``clean``, ``pgd`` (PGD-``pgd_steps``, step ``pgd_step``: ε/4 unless set, random start),
  ``apgd`` (APGD-CE, ``apgd_steps`` iterations, on ``apgd_images`` test images), ``h`` =
  harmonic mean of clean and pgd;
* ``ece_clean`` / ``ece_adv``: 15-bin L1 ECE of the softmax on clean / PGD inputs;
* ``ent_ratio``: mean normalised softmax entropy of the wrong PGD predictions over that of the
  wrong clean predictions (< 1: the attack suppresses uncertainty);
* ``clean_rolled``, ``pgd_rolled``, ``clean_mnist8`` (the digits only; a real CLIP's image
  folders have no shifted domains);
* the Dirichlet read-outs (evaluation α): ``au``, ``eu``, ``eu_code``, ``pu``, clean and
  ``*_adv``;
* ``zs/<dataset>/<metric>`` and ``zs/mean/<metric>``: the same on each zero-shot image folder of
  ``eval_paths`` (a real CLIP only; :mod:`.paper_zeroshot`).
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


def _device(model) -> torch.device:
    return next(model.parameters()).device


def clean_and_pgd(
    model, images, y: np.ndarray, cfg: DirclipConfig, steps: int, generator: torch.Generator,
    chunk: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Clean and PGD-``steps`` logits (on the CPU) and the labels of ``images`` (an array, or
    images read from files per row array), ``chunk`` images at a time on the model's device
    (``None``: all at once)."""
    dev = _device(model)
    n = len(y)
    lc, la = [], []
    for i in range(0, n, chunk or max(n, 1)):
        rows = np.arange(i, min(n, i + (chunk or n)))
        x, yy = torch.from_numpy(images[rows]).to(dev), torch.from_numpy(y[rows]).to(dev)
        lc.append(logits_of(model, x).cpu())
        la.append(logits_of(model, attack_pgd(model, x, yy, cfg, steps, generator)).cpu())
    empty = torch.zeros(0, len(model.class_names))
    return (torch.cat(lc) if lc else empty, torch.cat(la) if la else empty,
            torch.from_numpy(np.asarray(y)))  # fmt: skip


def validation(model, splits: Splits, cfg: DirclipConfig, step: int) -> dict[str, float]:
    """Clean and PGD-``val_pgd_steps`` accuracy on the held-out training images, and their
    harmonic mean ``val_h`` (the selection criterion)."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    was = model.training
    model.eval()
    lc, la, y = clean_and_pgd(model, splits.x_val, splits.y_val, cfg, cfg.val_pgd_steps, gen,
                              splits.chunk)  # fmt: skip
    model.train(was)
    clean, adv = _acc(lc, y), _acc(la, y)
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
    """Every metric of one model (the shifted domains where the splits have them; with
    ``shifts``, the zero-shot datasets of ``cfg.eval_paths``: :mod:`.paper_zeroshot`, listed
    and checked before anything is scored). ``apgd_offset``: the first test image of the APGD
    subset (the reproduction gives each seed its own images)."""
    zero_shot = None
    if shifts and cfg.eval_paths:
        from .paper_zeroshot import eval_sets

        zero_shot = eval_sets(cfg)
    model.eval()
    gen = torch.Generator().manual_seed(10_007 * seed + 1)
    x, y = splits.x_test, splits.y_test
    lc, la, yt = clean_and_pgd(model, x, y, cfg, cfg.pgd_steps, gen, splits.chunk)
    out = logit_metrics(lc, la, yt)
    if apgd:
        n = min(cfg.apgd_images, len(y))
        idx = (apgd_offset + np.arange(n)) % len(y)
        gen_a = torch.Generator().manual_seed(10_007 * seed + 2)
        dev, parts = _device(model), []
        for i in range(0, n, splits.chunk or max(n, 1)):
            rows = idx[i : i + (splits.chunk or n)]
            xs, ys = torch.from_numpy(x[rows]).to(dev), torch.from_numpy(y[rows]).to(dev)
            xa = apgd_ce(model.logits, xs, ys, cfg.eps, cfg.apgd_steps, generator=gen_a)
            parts.append(logits_of(model, xa).cpu())
        out["apgd"] = _acc(torch.cat(parts), yt[idx]) if parts else float("nan")
        out["pgd_on_apgd_images"] = float((la[idx].argmax(-1) == yt[idx]).double().mean())
    if shifts and splits.shifts:
        gen_r = torch.Generator().manual_seed(10_007 * seed + 3)
        lr, lra, _ = clean_and_pgd(model, splits.x_rolled, y, cfg, cfg.pgd_steps, gen_r,
                                   splits.chunk)  # fmt: skip
        out["clean_rolled"], out["pgd_rolled"] = _acc(lr, yt), _acc(lra, yt)
        xm, ym = torch.from_numpy(splits.x_mnist8), torch.from_numpy(splits.y_mnist8)
        out["clean_mnist8"] = _acc(logits_of(model, xm.to(_device(model))).cpu(), ym)
    if zero_shot:
        from .paper_zeroshot import zero_shot_metrics

        out.update(zero_shot_metrics(model, zero_shot, cfg, seed, evaluate=evaluate_model,
                                     apgd=apgd, apgd_offset=apgd_offset))  # fmt: skip
    return {k: float(v) for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}
