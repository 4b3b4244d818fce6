"""iclft's training: pretraining and fine-tuning of the linear-attention model.

One run (:func:`train_loop`, under Ray Train) pretrains the model on random linear tasks and then
fine-tunes a copy of it per configured variant (``zs/v``, ``zs+fs/all``, ...) on the target
task θ0. All models live in one checkpoint (``models.<row>.{Q,K,V}``), so the predictor can
serve any of them. Stages follow each other on one global step counter: pretraining takes
steps ``1..steps``, variant k the next ``finetune_steps``. Data parallelism: every worker draws
``ceil(batch / world_size)`` prompts per step from its own stream, and every worker steps with
the gradient averaged over the workers. :func:`train_in_process` runs one stage in the calling
process (the experiments' Ray tasks).
"""

from __future__ import annotations

import math
import sys
import time

import torch

from nshot.errors import NshotError
from nshot.train.trainer import Recipe, train

from . import data as D
from .config import ICLFTConfig, parse_variant, row_name
from .evaluation import validation
from .model import ICLFTBundle, LinearAttention, load_model, mse, set_trainable


def _log(msg: str) -> None:
    print(f"[iclft] {msg}", file=sys.stderr, flush=True)


def fs_weight(cfg: ICLFTConfig, t: int, T: int) -> float:
    """Weight of the auxiliary FS loss at iteration t of T: ``fs_weight·(T−1−t)/(T−1)``."""
    if not cfg.fs_anneal:
        return cfg.fs_weight
    return cfg.fs_weight * ((T - 1 - t) / (T - 1) if T > 1 else 1.0)


def stage_loss(
    model: LinearAttention,
    cfg: ICLFTConfig,
    *,
    seed: int,
    stage: str,
    stage_index: int,
    t: int,
    pool: tuple[torch.Tensor, torch.Tensor] | None = None,
    rank: int = 0,
    world: int = 1,
) -> torch.Tensor:
    """The loss of iteration ``t`` (0-based) of one stage, on the prompts of the stream
    ``(seed, stage, stage_index, t, rank)``: ``ceil(batch / world)`` of them, drawn on the CPU
    and moved to the model's device. Both prompts of the ZS+FS objective go through one call."""
    T = cfg.steps if stage == "pretrain" else cfg.ft_steps
    per_rank = math.ceil(cfg.batch / world)
    objective = "pretrain" if stage == "pretrain" else parse_variant(stage)[0]
    stream = D.PRETRAIN if stage == "pretrain" else D.FINETUNE
    device = next(model.parameters()).device
    gen = D.generator(seed, stream, stage_index, t, rank)
    if objective == "pretrain":
        Z, yq = D.pretrain_batch(cfg, per_rank, gen)
        return mse(model(Z.to(device)), yq.to(device))
    assert pool is not None
    Zz, Zf, yq = D.finetune_batch(pool[0], pool[1], per_rank, cfg.n_fs, gen)
    yq = yq.to(device)
    if objective == "zs":
        return mse(model(Zz.to(device)), yq)
    pz, pf = model(Zz.to(device), Zf.to(device))
    return mse(pz, yq) + fs_weight(cfg, t, T) * mse(pf, yq)


def sgd_update(
    loss_fn, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, cfg: ICLFTConfig,
    world: int = 1,
) -> torch.Tensor:  # fmt: skip
    """One update: the gradient of ``loss_fn()`` (averaged over the workers when there are
    several), its norm clipped jointly over ``params`` (the trainable matrices) to ``clip``,
    one SGD step. Returns the loss (detached)."""
    loss = loss_fn()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if world > 1:  # data parallel: every worker steps with the mean gradient
        import torch.distributed as dist

        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
    torch.nn.utils.clip_grad_norm_(params, cfg.clip)
    opt.step()
    return loss.detach()


def make_optimizer(cfg: ICLFTConfig, params: list[torch.nn.Parameter]) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)


class StageRecipe(Recipe):
    """One stage (pretraining, or one fine-tuning variant) of one model, in this process: the
    experiments' Ray tasks train each model with it (:func:`train_in_process`). The loss curve
    is the mean loss of every ``log_every`` iterations (and of the last ones)."""

    def __init__(
        self,
        cfg: ICLFTConfig,
        net: LinearAttention,
        seed: int,
        stage: str,
        *,
        progress: str | None = None,
    ) -> None:
        super().__init__(cfg)
        self.net, self.seed, self.stage, self.progress = net, seed, stage, progress

    def build(self) -> None:
        cfg, stage = self.cfg, self.stage
        self.index = cfg.stages().index(stage) if stage in cfg.stages() else 0
        self.pool = None
        if stage != "pretrain":
            x, y, _ = D.make_pool(cfg, self.seed)
            self.pool = (x, y)
        subset = "all" if stage == "pretrain" else parse_variant(stage)[1]
        self.model = self.net
        self.params = set_trainable(self.net, subset)
        self.optimizer = make_optimizer(cfg, self.params)
        self.losses: list[float] = []
        self.window: list[torch.Tensor] = []
        self.t0 = time.time()

    def schedule(self) -> tuple[int, int, int]:
        T = self.cfg.steps if self.stage == "pretrain" else self.cfg.ft_steps
        return T, self.cfg.log_every, self.cfg.log_every

    def step(self, step: int) -> dict[str, float]:
        loss = sgd_update(
            lambda: stage_loss(self.net, self.cfg, seed=self.seed, stage=self.stage,
                               stage_index=self.index, t=step - 1, pool=self.pool),
            self.params, self.optimizer, self.cfg,
        )  # fmt: skip
        self.window.append(loss)
        return {}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        self.losses.append(float(torch.stack(self.window).mean()))
        self.window = []
        if self.progress:
            _log(f"{self.progress}: step {step} loss {self.losses[-1]:.4g} "
                 f"({time.time() - self.t0:.0f}s)")  # fmt: skip
        return {**metrics, "loss": self.losses[-1]}


def train_in_process(
    net: LinearAttention, cfg: ICLFTConfig, seed: int, stage: str, *, progress: str | None = None
) -> list[float]:
    """Train ``net`` through one stage in this process (experiments' Ray tasks); loss curve."""
    return train(StageRecipe(cfg, net, seed, stage, progress=progress), session=False).losses


class ICLFTRecipe(Recipe):
    """The Ray Train run: pretraining, then each fine-tuning variant from the pretrained
    weights, on one step counter (stage k takes the global steps ``s0+1..s1`` of
    ``cfg.stage_bounds()``). One SGD-with-momentum optimiser per stage, over that stage's
    trainable matrices; a resume mid-stage restores its momentum, a stage entered at its first
    step starts from the pretrained weights. Each report carries the mean loss since the last
    one, the stage and the validation errors of the stage's model; every stage ends with a
    report and a checkpoint."""

    def build(self) -> None:
        cfg = self.cfg
        self.bounds = cfg.stage_bounds()
        self.rows = ["pretrained"] + [row_name(s) for s, _, _ in self.bounds[1:]]
        torch.manual_seed(cfg.seed)
        self.model = ICLFTBundle(cfg.d, self.rows, cfg.init_std)
        # the model a step trains changes with the stage, so no DDP wrapper is made for the
        # bundle (forward is not a module): sgd_update averages the stage's gradients itself
        self.forward = self._stage_forward
        self.theta0 = D.target_task(cfg, cfg.seed)
        self.pool = None
        if cfg.stage == "finetune":
            x, y, _ = D.make_pool(cfg, cfg.seed)
            self.pool = (x, y)
        self.per_rank = math.ceil(cfg.batch / self.world_size)
        self.trained: list[str] = []
        self.resumed_from: list[int] = []
        self.k: int | None = None  # the stage being trained
        self.started = False

    def _stage_forward(self, *prompts: torch.Tensor):  # noqa: ANN202
        return self.net(*prompts)

    def on_restore(self, restored) -> None:  # noqa: ANN001
        self.trained = list(restored.extra.get("trained", []))
        self.resumed_from = [*restored.extra.get("resumed_from", []), restored.step]

    def _skipped(self) -> int:
        """Steps this run does not train: the pretraining, when a fresh run takes the
        pretrained model from ``init_checkpoint``."""
        if self.restored is None and self.cfg.init_checkpoint:
            return self.bounds[0][2]
        return 0

    def schedule(self) -> tuple[int, int, int]:
        cfg = self.cfg
        return self.bounds[-1][2], cfg.log_every, cfg.checkpoint_every

    def _on_cadence(self, step: int, every: int) -> bool:
        """Every ``every`` steps and at the end of every stage (a stage's loss window and its
        model's checkpoint close with it), never over the pretraining steps a run that starts
        from ``init_checkpoint`` skips."""
        if step <= self._skipped():
            return False
        return step % every == 0 or step in {s1 for _, _, s1 in self.bounds}

    def is_report(self, step: int) -> bool:
        return self._on_cadence(step, self.cfg.log_every)

    def is_checkpoint(self, step: int) -> bool:
        return self._on_cadence(step, self.cfg.checkpoint_every) or step == self.bounds[-1][2]

    def _start(self) -> None:
        """Before the first step: the pretrained model of ``init_checkpoint`` (a fresh run)."""
        from nshot.train.checkpoint import load_checkpoint

        self.started = True
        if not self._skipped():
            return
        init = load_checkpoint(self.cfg.init_checkpoint, method="iclft")
        pre, extra0 = load_model(init)
        if "pretrained" not in extra0.get("trained", []) or int(extra0["d"]) != self.cfg.d:
            raise NshotError(
                f"init_checkpoint {init.path}: no trained pretrained model of d = {self.cfg.d}"
            )
        self.model.models["pretrained"].load_state_dict(pre.models["pretrained"].state_dict())
        self.trained = ["pretrained"]
        _log(f"fine-tuning from the pretrained model of {init.path}")

    def _enter(self, k: int, step: int) -> None:
        """Set up stage ``k`` at global step ``step``: its model, trainable matrices and
        optimiser (with the checkpoint's momentum on a resume inside the stage)."""
        stage, s0, _ = self.bounds[k]
        self.k, self.stage, self.row = k, stage, self.rows[k]
        self.net = self.model.models[self.row]
        if k > 0 and step == s0 + 1:  # a fine-tuning run starts from the pretrained weights
            self.net.load_state_dict(self.model.models["pretrained"].state_dict())
        subset = "all" if stage == "pretrain" else parse_variant(stage)[1]
        self.params = set_trainable(self.net, subset)
        self.optimizer = make_optimizer(self.cfg, self.params)
        restored = self.restored
        if restored is not None and s0 < restored.step < self.bounds[k][2]:  # momentum too
            state = restored.checkpoint.optimizer_state()
            if state is not None:
                self.optimizer.load_state_dict(state)
        if self.rank == 0:
            _log(f"stage {k} '{stage}' ({subset} trainable) from step {step - 1 - s0}")
        self.window: list[torch.Tensor] = []

    def step(self, step: int) -> dict[str, float]:
        if not self.started:
            self._start()
        if step <= self._skipped():
            self.samples_per_step = 0
            return {}
        self.samples_per_step = self.per_rank
        k = next(i for i, (_, s0, s1) in enumerate(self.bounds) if s0 < step <= s1)
        if k != self.k:
            self._enter(k, step)
        s0, s1 = self.bounds[k][1], self.bounds[k][2]
        loss = sgd_update(
            lambda: stage_loss(self.net, self.cfg, seed=self.cfg.seed, stage=self.stage,
                               stage_index=k, t=step - 1 - s0, pool=self.pool, rank=self.rank,
                               world=self.world_size),
            self.params, self.optimizer, self.cfg, self.world_size,
        )  # fmt: skip
        self.window.append(loss)
        if step == s1:  # the stage's model is trained: frozen from here on
            self.trained.append(self.row)
            for p in self.net.parameters():
                p.requires_grad_(False)
        return {}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        out = {"loss": float(torch.stack(self.window).mean()), "stage": float(self.k)}
        out.update(validation(self.net, self.cfg, self.cfg.seed, self.theta0))
        self.window = []
        return out

    def extra(self) -> dict:
        cfg = self.cfg
        return {
            "d": cfg.d,
            "rows": self.rows,
            "variants": {
                r: "pretrained" if s == "pretrain" else s
                for r, (s, _, _) in zip(self.rows, self.bounds)
            },  # fmt: skip
            "theta0": self.theta0.tolist(),
            "sigma2": cfg.sigma2,
            # steps this run was resumed from (one entry per resume)
            "resumed_from": self.resumed_from,
            "stage": self.stage,
            "trained": list(self.trained),
        }


def train_loop(cfg: ICLFTConfig) -> None:
    """The Ray Train loop: pretraining, then each fine-tuning variant, on one step counter."""
    train(ICLFTRecipe(cfg))
