"""dirclip's fine-tuning: one row (``cfg.loss``) under Ray Train.

Per step (paper §3, Algorithm 1): the batch's adversarial images are found by PGD against the
current trainable tower g (pixel space, random start, clamped), then

* ``ucat``: ``CE(ℓ_adv, y) + λ · KL(Dir(α(ℓ_adv)) ‖ Dir(α(ℓ_ori)))``, ℓ_ori from the frozen
  original tower g₀ on the clean images, α the training concentrations, KL in float64;
* ``forward_kl``: the same with the KL's arguments swapped (the paper's ablation);
* ``prob_kl``: ``CE + λ_p · KL(softmax(ℓ_adv) ‖ softmax(ℓ_ori))`` (a reconstruction);
* ``tecoa``: ``CE(ℓ_adv, y)`` (Mao et al. 2023);
* ``fare``: ``‖g(x_adv) − g₀(x)‖²`` with PGD maximising the same (Schlarmann et al. 2024; no
  labels).

``tau = 0`` with ``loss="ucat"`` is the negative control (the UCAT code path with λ = 0).
Batches and attack starts are functions of (seed, step, rank), so a resumed run repeats an
uninterrupted one. Every ``val_every`` steps the held-out training images are scored (clean
and PGD accuracy, harmonic mean ``val_h``); the best tower so far is kept (``best.*`` weights
of the checkpoint) and is the one evaluated and served. The backbone (the tiny CLIP, or a real
one for ``paper``) and its data come from the config; the recipe is the same for both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nshot.train.trainer import Recipe, train

from .attacks import ce_loss, pgd
from .config import DirclipConfig
from .data import Splits, splits_of
from .dirichlet import alpha_train, dirichlet_kl
from .evaluation import validation
from .model import DirClip, base_clip, build_model, checkpoint_state, model_record, trainable_state


def batch_rows(n: int, batch: int, step: int, seed: int) -> np.ndarray:
    """Rows of the global batch ``step`` (1-based): consecutive slices of one permutation of
    the training images per epoch."""
    start = (step - 1) * batch
    rows: list[int] = []
    while len(rows) < batch:
        epoch, pos = divmod(start + len(rows), n)
        perm = np.random.default_rng([seed, 3, epoch]).permutation(n)
        rows.extend(perm[pos : pos + batch - len(rows)].tolist())
    return np.asarray(rows)


def step_loss(
    model: DirClip,
    fwd: torch.nn.Module,
    cfg: DirclipConfig,
    x: torch.Tensor,
    y: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one batch for ``cfg.loss`` and its statistics; ``fwd`` is the (DDP-wrapped)
    model whose forward gives g's logits (or features), ``model`` the unwrapped one that the
    attack and g₀ use."""
    with torch.no_grad():
        f0 = model.features(x, original=True)
    if cfg.loss == "fare":

        def emb_loss(z: torch.Tensor) -> torch.Tensor:
            return ((model.features(z) - f0) ** 2).sum(-1)

        x_adv = pgd(emb_loss, x, cfg.eps, cfg.train_attack_steps, cfg.train_attack_step,
                    generator)  # fmt: skip
        f = fwd(x_adv, features=True)
        loss = ((f - f0) ** 2).sum(-1).mean()
        with torch.no_grad():
            la = model.scale * F.normalize(f, dim=-1) @ model.text_features.T
        ce = F.cross_entropy(la, y)
        term = torch.zeros((), dtype=torch.float64)
    else:
        x_adv = pgd(ce_loss(model.logits, y), x, cfg.eps, cfg.train_attack_steps,
                    cfg.train_attack_step, generator)  # fmt: skip
        la = fwd(x_adv)
        ce = F.cross_entropy(la, y)
        lo = model.scale * F.normalize(f0, dim=-1) @ model.text_features.T
        if cfg.loss in ("ucat", "forward_kl"):
            a_adv = alpha_train(la, model.scale, cfg.tau_prime)
            a_ori = alpha_train(lo, model.scale, cfg.tau_prime)
            kl = dirichlet_kl(a_adv, a_ori) if cfg.loss == "ucat" else dirichlet_kl(a_ori, a_adv)
            term = kl_term(kl, a_ori, cfg)
        elif cfg.loss == "prob_kl":
            lp_adv = la.to(torch.float64).log_softmax(-1)
            lp_ori = lo.to(torch.float64).log_softmax(-1)
            term = cfg.prob_kl_weight * (lp_adv.exp() * (lp_adv - lp_ori)).sum(-1).mean()
        else:
            term = torch.zeros((), dtype=torch.float64)
        loss = (ce.to(torch.float64) + term).to(torch.float32)
    stats = {
        "loss": float(loss.detach()),
        "ce": float(ce.detach()),
        "lam_kl": float(term.detach()),
        "adv_acc": float((la.detach().argmax(-1) == y).float().mean()),
    }
    return loss, stats


def kl_term(kl: torch.Tensor, a_ori: torch.Tensor, cfg: DirclipConfig) -> torch.Tensor:
    """The weighted KL of a batch: ``λ · mean KL`` (``max_alpha``, the released code), or
    ``kl_weight · Σ KL / Σ α₀(g₀)`` (``mean_alpha0``: the constant e^{2/τ'} of λ replaced by the
    batch's mean concentration of the frozen model, detached, so that the KL weighs against the
    cross-entropy as on real CLIP whatever the spread of the backbone's cosines)."""
    if cfg.kl_normalisation == "mean_alpha0":
        return cfg.kl_weight * kl.sum() / a_ori.sum(-1).detach().sum()
    return cfg.lam * kl.mean()


def make_optimizer(model: DirClip, cfg: DirclipConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.trainable(), lr=cfg.lr, momentum=0.9)
    return torch.optim.Adam(model.trainable(), lr=cfg.lr)


def lr_at(cfg: DirclipConfig, step: int) -> float:
    """Adam: constant; SGD: linear warm-up then cosine decay (the released code's schedule)."""
    if cfg.optimizer == "adam":
        return cfg.lr
    if step <= cfg.warmup:
        return cfg.lr * step / max(cfg.warmup, 1)
    t = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
    return 0.5 * cfg.lr * (1 + math.cos(math.pi * min(t, 1.0)))


class DirclipRecipe(Recipe):
    """UCAT's fine-tuning (one row, ``cfg.loss``) as :mod:`nshot.train.trainer` runs it: per
    step the lr of :func:`lr_at`, this rank's shard of the global batch (the next step's images
    read in a thread while this one computes), the attack and :func:`step_loss`, one optimiser
    step; :func:`.evaluation.validation` every ``val_every`` steps and at the end (and at step
    0 of a fresh run: the starting point is a candidate too), the best tower so far kept.
    Reports the window's means of the loss terms, the clean accuracy on the step's batch (its
    first ``splits.chunk`` images) and the validation scores; a checkpoint holds the current
    weights (:func:`.model.checkpoint_state`: all, or g's on a backbone re-read from its path),
    g's selected (``best.*``) ones and the optimiser.

    The network is :attr:`net`, not :attr:`model`: a row of the experiments trains the model
    it is given on that model's device (a real CLIP's reproduction: its GPU), so the trainer
    must not move it; on a worker, :meth:`build` puts it on the worker's device. Batches follow
    the network's device.

    Given ``splits`` and ``model``, a row trained in-process (:func:`fit_model`,
    ``on_step(step, stats, best)`` after every step)."""

    def __init__(
        self,
        cfg: DirclipConfig,
        splits: Any = None,
        model: DirClip | None = None,
        *,
        on_step: Callable[[int, dict[str, float], dict], None] | None = None,
    ) -> None:
        super().__init__(cfg)
        self.splits, self.net = splits, model
        self.validate, self.on_step = validation, on_step

    def make(self) -> None:
        """Build :attr:`net` on the config's backbone and :attr:`splits` from its data."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        backbone = base_clip(cfg)
        self.splits = splits_of(cfg, backbone.image_size)
        self.net = build_model(cfg, backbone, self.splits.class_names)

    def build(self) -> None:
        cfg = self.cfg
        if cfg.batch_size % self.world_size:
            raise ValueError(f"batch_size {cfg.batch_size} is not divisible by {self.world_size}")
        if self.net is None:
            self.make()
            self.net.to(self.device)
        self.forward = self.net
        #: images of the step's batch that the report's ``clean_acc`` scores (``None``: all)
        self.clean_rows = self.splits.chunk
        self.optimizer = make_optimizer(self.net, cfg)
        self.best: dict[str, Any] = {"step": 0, "val_h": -1.0, "state": None}
        self.y_all = torch.from_numpy(self.splits.y_train)
        self.per = cfg.batch_size // self.world_size
        self.samples_per_step = self.per
        self.reader: ThreadPoolExecutor | None = None
        self.ahead: Future | None = None
        self.window: list[dict[str, float]] = []
        self.last: dict[str, float] = {}
        self.ckpt_state: dict[str, torch.Tensor] = {}
        self.record = (
            {"model": model_record(self.net, cfg), "loss": cfg.loss, "lambda": cfg.lam}
            if self.session
            else {}
        )

    def on_restore(self, restored) -> None:  # noqa: ANN001
        dev = next(self.net.parameters()).device
        state = dict(restored.checkpoint.weights())
        best_state = {k.removeprefix("best."): v.to(dev)
                      for k, v in state.items() if k.startswith("best.")}  # fmt: skip
        current = {k: v for k, v in state.items() if not k.startswith("best.")}
        self.net.load_state_dict({**self.net.state_dict(), **current})
        opt_state = restored.checkpoint.optimizer_state()
        if opt_state is not None:
            self.optimizer.load_state_dict(opt_state)
        self.best = {**restored.extra.get("selected", {}), "state": best_state}

    def _batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows of ``step`` and their images."""
        rows = batch_rows(len(self.y_all), self.cfg.batch_size, step, self.cfg.seed)
        rows = rows[self.rank * self.per : (self.rank + 1) * self.per]
        return rows, self.splits.x_train[rows]

    def _read_ahead(self, step: int) -> Future | None:
        return self.reader.submit(self._batch, step) if step <= self.cfg.steps else None

    def begin(self, start: int) -> None:
        """This run's first step: the starting point scored (a fresh run), the reader started."""
        if start == 0 and self.best["state"] is None:  # the starting point is a candidate too
            v = self.validate(self.net, self.splits, self.cfg, 0)
            self.best.update(step=0, state=trainable_state(self.net), **v)
        self.net.train()
        self.reader = ThreadPoolExecutor(max_workers=1)
        self.ahead = self._read_ahead(start + 1)

    def step(self, step: int) -> dict[str, float]:
        cfg, best = self.cfg, self.best
        if self.reader is None:
            self.begin(step - 1)
        device = next(self.net.parameters()).device
        gen = torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, step, self.rank, 5])
                                                .integers(2**62)))  # fmt: skip
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        (rows, images), self.ahead = self.ahead.result(), self._read_ahead(step + 1)
        if self.ahead is None:  # the last step: nothing more to read
            self.reader.shutdown()
        x = torch.as_tensor(images).to(device)
        loss, stats = step_loss(self.net, self.forward, cfg, x, self.y_all[rows].to(device), gen)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if step % cfg.val_every == 0 or step == cfg.steps:
            v = self.validate(self.net, self.splits, cfg, step)
            stats.update(v)
            if v["val_h"] > best["val_h"]:
                best.update(step=step, state=trainable_state(self.net), **v)
        if self.on_step is not None:
            self.on_step(step, stats, best)
        self.last = stats
        terms = {k: stats[k] for k in ("loss", "ce", "lam_kl", "adv_acc")}
        self.window.append(terms)
        return terms

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        cfg, best, window = self.cfg, self.best, self.window
        self.window = []
        if not self.session:  # a row in-process: its caller's on_step sees every step
            return metrics
        # np.mean over the window, as the reports always were
        metrics = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
        rows = batch_rows(len(self.y_all), cfg.batch_size, step, cfg.seed)[: self.clean_rows]
        with torch.no_grad():
            xb = torch.from_numpy(self.splits.x_train[rows]).to(next(self.net.parameters()).device)
            yb = torch.from_numpy(self.splits.y_train[rows])
            pred = self.net.logits(xb).argmax(-1).cpu()
            metrics["clean_acc"] = float((pred == yb).float().mean())
        for k in ("val_clean", "val_pgd", "val_h"):
            if k in best:
                metrics[k] = float(self.last.get(k, best[k]))
        self.ckpt_state = {}
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            self.ckpt_state = {**checkpoint_state(self.net),
                               **{f"best.{k}": v for k, v in best["state"].items()}}  # fmt: skip
        return metrics

    def state(self) -> dict[str, torch.Tensor]:
        return self.ckpt_state

    def extra(self) -> dict[str, Any]:
        return {**self.record, "selected": _best_record(self.best)}


def fit_model(
    cfg: DirclipConfig,
    splits: Splits,
    model: DirClip,
    *,
    on_step: Callable[[int, dict[str, float], dict], None] | None = None,
) -> tuple[DirClip, dict]:
    """Train ``cfg.steps`` steps in this process (:class:`DirclipRecipe`, the recipe a worker
    runs) on the model's device; returns the model holding the validation-selected weights and
    the selection record ``{"step", "val_h", "state"}``. ``splits``' training images are any
    array indexable by a row array (a real CLIP's are read from files per batch)."""
    recipe = DirclipRecipe(cfg, splits, model, on_step=on_step)
    train(recipe, session=False)
    best = recipe.best
    model.load_state_dict({**model.state_dict(), **best["state"]})
    return model.eval(), best


def _best_record(best: dict) -> dict:
    return {k: v for k, v in best.items() if k != "state"}


def train_loop(cfg: DirclipConfig) -> None:
    """Fine-tuning under Ray Train: each worker attacks and trains on its shard of the global
    batch (DDP averages g's gradients); CE, λ·KL and the clean and adversarial batch accuracy
    every ``log_every`` steps, validation every ``val_every``, a checkpoint (current and
    selected weights, optimiser) every ``checkpoint_every`` and at the end."""
    train(DirclipRecipe(cfg))
