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
of the checkpoint) and is the one evaluated and served.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from nshot.errors import ConfigError
from nshot.train import session

from .attacks import ce_loss, pgd
from .config import DirclipConfig
from .data import Splits, load_splits
from .dirichlet import alpha_train, dirichlet_kl
from .evaluation import validation
from .model import DirClip, build_model, model_record


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


def trainable_state(model: DirClip) -> dict[str, torch.Tensor]:
    """g's weights (the model's ``TRAINABLE`` prefixes, ``clip.visual*`` by default), cloned."""
    prefixes = getattr(model, "TRAINABLE", ("clip.visual",))
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if k.startswith(prefixes)}  # fmt: skip


def fit_model(
    cfg: DirclipConfig,
    splits: Splits,
    model: DirClip,
    *,
    opt: torch.optim.Optimizer | None = None,
    start: int = 0,
    rank: int = 0,
    world: int = 1,
    forward: torch.nn.Module | None = None,
    best: dict | None = None,
    on_step: Callable[[int, dict[str, float], dict], None] | None = None,
    before_step: Callable[[int], None] | None = None,
    validate: Callable[..., dict[str, float]] = validation,
) -> tuple[DirClip, dict]:
    """Train ``cfg.steps`` steps from ``start``; returns the model holding the validation-
    selected weights and the selection record ``{"step", "val_h", "state"}``. ``splits``'
    training images are any array indexable by a row array (the paper backbone's are read
    from files per batch, the next one in a thread while a step computes); batches go to the
    model's device; ``validate(model, splits, cfg, step)`` scores the held-out images."""
    opt = opt or make_optimizer(model, cfg)
    fwd = forward if forward is not None else model
    best = best if best is not None else {"step": 0, "val_h": -1.0, "state": None}
    y_all = torch.from_numpy(splits.y_train)
    device = next(model.parameters()).device
    per = cfg.batch_size // world
    if start == 0 and best["state"] is None:  # the starting point is a candidate too
        v = validate(model, splits, cfg, 0)
        best.update(step=0, state=trainable_state(model), **v)
    model.train()

    def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows of ``step`` and their images."""
        rows = batch_rows(len(y_all), cfg.batch_size, step, cfg.seed)[rank * per : (rank + 1) * per]
        return rows, splits.x_train[rows]

    def read_ahead(step: int) -> Future | None:
        return reader.submit(batch, step) if step <= cfg.steps else None

    # the next step's images are read (from files, on the paper path) while this step computes
    with ThreadPoolExecutor(max_workers=1) as reader:
        ahead = read_ahead(start + 1)
        for step in range(start + 1, cfg.steps + 1):
            if before_step is not None:
                before_step(step)
            gen = torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, step, rank, 5])
                                                    .integers(2**62)))  # fmt: skip
            for group in opt.param_groups:
                group["lr"] = lr_at(cfg, step)
            (rows, images), ahead = ahead.result(), read_ahead(step + 1)
            x = torch.as_tensor(images).to(device)
            loss, stats = step_loss(model, fwd, cfg, x, y_all[rows].to(device), gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % cfg.val_every == 0 or step == cfg.steps:
                v = validate(model, splits, cfg, step)
                stats.update(v)
                if v["val_h"] > best["val_h"]:
                    best.update(step=step, state=trainable_state(model), **v)
            if on_step is not None:
                on_step(step, stats, best)
    model.load_state_dict({**model.state_dict(), **best["state"]})
    return model.eval(), best


def _best_record(best: dict) -> dict:
    return {k: v for k, v in best.items() if k != "state"}


def train_loop(cfg: DirclipConfig) -> None:
    """Fine-tuning under Ray Train: each worker attacks and trains on its shard of the global
    batch (DDP averages g's gradients); CE, λ·KL and the clean and adversarial batch accuracy
    every ``log_every`` steps, validation every ``val_every``, a checkpoint (current and
    selected weights, optimiser) every ``checkpoint_every`` and at the end."""
    if cfg.backbone != "tinyclip":
        raise ConfigError(
            "backbone 'clip' trains through the method (nshot.methods.dirclip.paper.train_loop)"
        )
    ctx = session.context()
    torch.set_num_threads(cfg.torch_threads)
    if cfg.batch_size % ctx.world_size:
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by {ctx.world_size}")
    splits = load_splits(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    opt = make_optimizer(model, cfg)
    restored = session.restore()
    start, best = 0, None
    if restored is not None:
        state = dict(restored.checkpoint.weights())
        best_state = {k.removeprefix("best."): v for k, v in state.items() if k.startswith("best.")}
        model.load_state_dict({k: v for k, v in state.items() if not k.startswith("best.")})
        opt_state = restored.checkpoint.optimizer_state()
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        start = restored.step
        best = {**restored.extra.get("selected", {}), "state": best_state}
    ddp = session.prepare_model(model)
    record = {"model": model_record(model), "loss": cfg.loss, "lambda": cfg.lam}
    window: list[dict[str, float]] = []

    def on_step(step: int, stats: dict[str, float], best: dict) -> None:
        window.append({k: stats[k] for k in ("loss", "ce", "lam_kl", "adv_acc")})
        is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
        if step % cfg.log_every == 0 or is_ckpt:
            metrics = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
            with torch.no_grad():
                rows = batch_rows(len(splits.y_train), cfg.batch_size, step, cfg.seed)
                xb = torch.from_numpy(splits.x_train[rows])
                yb = torch.from_numpy(splits.y_train[rows])
                metrics["clean_acc"] = float((model.logits(xb).argmax(-1) == yb).float().mean())
            for k in ("val_clean", "val_pgd", "val_h"):
                if k in best:
                    metrics[k] = float(stats.get(k, best[k]))
            state: dict[str, torch.Tensor] = {}
            if is_ckpt:
                best_state = {f"best.{k}": v for k, v in best["state"].items()}
                state = {**model.state_dict(), **best_state}
            session.report(
                metrics, step=step, model=state, optimizer=opt if is_ckpt else None,
                extra={**record, "selected": _best_record(best)}, checkpoint=is_ckpt,
                samples=len(window) * cfg.batch_size // ctx.world_size,
            )  # fmt: skip
            window.clear()

    fit_model(
        cfg, splits, model, opt=opt, start=start, rank=ctx.rank, world=ctx.world_size,
        forward=ddp if ctx.world_size > 1 else None, best=best, on_step=on_step,
        before_step=lambda s: session.maybe_inject_fault(s, restored),
    )  # fmt: skip
