"""One CFR run per (object class, k): stages 1–3 under Ray Train (paper §3).

Steps 1 … ``map_epochs`` are stage-1 epochs (batch one image, in the k shots' order); at the end
of stage 1 the memory banks are built (stage 2) and θ (quantile mode) is read off the k shots;
the next ``ret_epochs`` steps are stage-3 epochs of the retriever, whose queries and bank
subsample are drawn from a generator seeded by (seed, step, rank), so a resumed run sees what an
uninterrupted one sees. The bank-only baselines (PatchCore, BTF) have one step: the banks.
One Adam holds both trained parts in two parameter groups (the mappings at ``map_lr``, the
retriever at ``ret_lr``); a stage steps only its own part: the other part's gradients are
dropped before the step (under DDP every parameter gets a gradient, zero for the other part,
and Adam would otherwise move a frozen part on its momentum and count steps the part never
took).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from nshot.train.trainer import Recipe, train

from .config import MAPPING_SYSTEMS, RETRIEVER_SYSTEMS, CfrConfig
from .data import shot_split
from .evaluation import class_test_features, validation_metrics
from .features import make_extractors
from .model import CfrModel, build_model


@dataclass
class Shots:
    """Features of the k training images: per image (valid F2 rows, valid F3 rows)."""

    f2: list[torch.Tensor]
    f3: list[torch.Tensor]
    grids: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # k × H × W × C2, × C3, valid

    @property
    def all_f2(self) -> torch.Tensor:
        return torch.cat(self.f2)

    @property
    def all_f3(self) -> torch.Tensor:
        return torch.cat(self.f3)


def shot_features(
    cfg: CfrConfig, cls: str | None = None, k: int | None = None,
    device: torch.device | str = "cpu",
) -> Shots:  # fmt: skip
    """The k shots' features, extracted on ``device``; their valid rows on ``device`` (the
    grids stay on the CPU)."""
    cls = cls or cfg.class_name
    k = k or cfg.shot
    shots = shot_split(cfg, cls, k)
    ext = make_extractors(cfg, device)
    g2, g3 = ext(shots.rgb, shots.xyz)
    valid = ext.valid(shots.xyz, g3)
    f2 = [g2[i][valid[i]].to(device) for i in range(k)]
    f3 = [g3[i][valid[i]].to(device) for i in range(k)]
    return Shots(f2, f3, (g2, g3, valid))


def bank_sizes(cfg: CfrConfig, shots: Shots) -> dict[str, int]:
    from .model import BANKS, coreset_size

    n = int(sum(len(x) for x in shots.f2))
    return dict.fromkeys(BANKS, coreset_size(n, cfg.coreset_frac))


def new_model(cfg: CfrConfig, shots: Shots) -> CfrModel:
    """A fresh model on the device of the shots' features."""
    torch.manual_seed(cfg.seed + 115)  # the paper's training seed 115 at seed 0; equal on ranks
    return build_model(cfg, bank_sizes(cfg, shots)).to(shots.f2[0].device)


def new_optimizer(cfg: CfrConfig, model: CfrModel) -> torch.optim.Optimizer:
    return torch.optim.Adam([
        {"params": model.mapping_parameters(), "lr": cfg.map_lr},
        {"params": list(model.retriever.parameters()), "lr": cfg.ret_lr},
    ])  # fmt: skip


def finish_banks(cfg: CfrConfig, model: CfrModel, shots: Shots) -> None:
    """Stage 2 and θ: the banks from the k shots, θ = quantile of d over their valid pixels."""
    model.set_banks(shots.all_f2, shots.all_f3, cfg.seed + 7)
    if cfg.system in MAPPING_SYSTEMS:
        with torch.no_grad():
            d = model.reliability(model.f32(shots.all_f3))
        model.theta_q.fill_(float(torch.quantile(d, cfg.theta_quantile)))


@torch.no_grad()
def set_threshold_hint(cfg: CfrConfig, model: CfrModel, shots: Shots) -> None:
    """The 95th percentile of the image scores of the k normal training images."""
    g2, g3, valid = shots.grids
    theta = None if cfg.theta_mode == "quantile" else cfg.theta
    gen = torch.Generator().manual_seed(cfg.infer_seed)
    scores = [model.score(g2[i], g3[i], valid[i], cfg.system, theta, gen).image_score
              for i in range(len(valid))]  # fmt: skip
    model.threshold_hint.fill_(float(np.quantile(scores, 0.95)))


def epoch(
    cfg: CfrConfig, model: CfrModel, opt: torch.optim.Optimizer, shots: Shots, step: int,
    rank: int = 0, forward: torch.nn.Module | None = None,
) -> dict[str, float]:  # fmt: skip
    """One epoch of the stage that ``step`` belongs to; returns its mean loss."""
    fwd = forward if forward is not None else model
    losses = []
    if step <= cfg.map_epochs:
        for f2, f3 in zip(shots.f2, shots.f3, strict=True):
            loss = _call(fwd, "mapping_loss", f2, f3, cfg.cycles)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            _drop_grads(model.retriever.parameters())
            opt.step()
            losses.append(float(loss.detach()))
        return {"loss": float(np.mean(losses)), "stage": 1.0}
    gen = torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, step, rank])
                                            .integers(2**31)))  # fmt: skip
    for f2, f3 in zip(shots.f2, shots.f3, strict=True):
        n = min(len(f3), cfg.max_queries)
        idx = torch.randperm(len(f3), generator=gen)[:n].to(f3.device)
        loss = _call(fwd, "retrieval_loss", f3[idx], f2[idx], cfg.bank_subsample, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        _drop_grads(model.mapping_parameters())
        opt.step()
        losses.append(float(loss.detach()))
    return {"loss": float(np.mean(losses)), "stage": 3.0}


def _drop_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Adam skips a parameter without a gradient: it neither moves it nor counts the step."""
    for p in params:
        p.grad = None


def _call(fwd: torch.nn.Module, name: str, *args: object) -> torch.Tensor:
    """Call ``name`` on the model; through DDP, by a forward hook so gradients are averaged."""
    inner = getattr(fwd, "module", None)
    if inner is None:
        return getattr(fwd, name)(*args)
    return fwd(name, *args)


class _Dispatch(torch.nn.Module):
    """DDP calls ``forward``; this routes it to a named method of the CFR model."""

    def __init__(self, model: CfrModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, name: str, *args: object) -> torch.Tensor:
        out = getattr(self.model, name)(*args)
        # every parameter takes part in DDP's reduction; `epoch` drops the zero gradients of
        # the part a stage does not train
        return out + 0.0 * sum(p.sum() for p in self.model.parameters())


def run_record(cfg: CfrConfig, model: CfrModel, step: int) -> dict:
    """What a checkpoint keeps about its run (JSON): the banks exist from the end of stage 1."""
    bank_step = cfg.map_epochs if cfg.system in MAPPING_SYSTEMS else 1
    return {"class_name": cfg.class_name, "shot": cfg.shot, "system": cfg.system,
            "bank_sizes": model.bank_sizes(), "banks_built": step >= bank_step,
            "theta_q": float(model.theta_q),
            "threshold_hint": float(model.threshold_hint)}  # fmt: skip


class CfrRecipe(Recipe):
    """Stages 1–3 of ``cfg.system``: a step is one stage epoch (:func:`epoch`, one Adam step per
    shot), the banks and θ at the end of stage 1 (at step 1 for the bank-only systems), the
    threshold hint at the last step. In a Ray run the report adds the stage, θ and the
    validation AUPRO@30 % and I-AUROC; in process (``shots`` given) ``on_step`` sees each step's
    loss and stage."""

    def __init__(
        self,
        cfg: CfrConfig,
        shots: Shots | None = None,
        *,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        super().__init__(cfg)
        self.shots, self.on_step = shots, on_step
        self.samples_per_step = 1

    def build(self) -> None:
        cfg = self.cfg
        if self.shots is None:
            self.shots = shot_features(cfg, device=self.device)
        else:  # in process: the model trains where the given shots are (a job's GPU)
            self.device = self.shots.f2[0].device
        self.model = new_model(cfg, self.shots)
        self.optimizer = new_optimizer(cfg, self.model)
        self.trains_maps = cfg.system in MAPPING_SYSTEMS
        if self.world_size > 1 and self.trains_maps:
            self.forward = _Dispatch(self.model)  # DDP-wrapped by the trainer
        self.val = (class_test_features(cfg, cfg.class_name, "val", self.device)
                    if self.session else None)  # fmt: skip
        self.stage, self.record, self.placed = 0.0, None, False

    def step(self, step: int) -> dict[str, float]:
        cfg, model, shots = self.cfg, self.model, self.shots
        if not self.placed:  # an in-process run places the model on the CPU: back to the shots
            model.to(self.device)
            self.placed = True
        if self.trains_maps:
            stats = epoch(cfg, model, self.optimizer, shots, step, self.rank, self.forward)
        else:
            stats = {"loss": 0.0, "stage": 2.0}
        if step == cfg.map_epochs or not self.trains_maps:
            finish_banks(cfg, model, shots)
        if step == cfg.steps:
            set_threshold_hint(cfg, model, shots)
        if self.on_step is not None:
            self.on_step(step, stats)
        self.stage = stats["stage"]  # reported as the window's last, not its mean
        return {"loss": stats["loss"]}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        if not self.session:
            return metrics
        model = self.model
        self.record = run_record(self.cfg, model, step)
        return {**metrics, "stage": self.stage, "theta": float(model.theta_q),
                **validation_metrics(model, self.cfg, self.val,
                                     self.record["banks_built"])}  # fmt: skip

    def extra(self) -> dict:
        return {"run": self.record}


def fit(
    cfg: CfrConfig,
    shots: Shots | None = None,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> CfrModel:
    """Stages 1–3 of ``cfg.system`` in this process (a row of the experiments), on the device
    of ``shots`` (default: the k shots' features on the CPU)."""
    shots = shots or shot_features(cfg)
    return train(CfrRecipe(cfg, shots, on_step=on_step), session=False).model


def train_loop(cfg: CfrConfig) -> None:
    """Stages 1–3 of one (class, k) run under Ray Train; the stage loss and the validation
    AUPRO@30 % and I-AUROC (``val_aupro30``, the Tune objective) every ``log_every`` epochs, a
    checkpoint (mappings, retriever, banks, θ) every ``checkpoint_every`` and at the end. With
    several workers DDP averages the stage-1 gradients (every worker sees the same k shots, so
    the run equals a one-worker run) and each worker draws its own retriever queries.
    """
    train(CfrRecipe(cfg))


__all__ = ["RETRIEVER_SYSTEMS", "CfrRecipe", "fit", "shot_features", "train_loop"]
