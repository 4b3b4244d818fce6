"""iclft's training: pretraining and fine-tuning of the linear-attention model.

One run (:func:`train_loop`, under Ray Train) pretrains the model on random linear tasks and then
fine-tunes a copy of it per configured variant (``zs/v``, ``zs+fs/all``, ...) on the target
task θ0. All models live in one checkpoint (``models.<row>.{Q,K,V}``), so the predictor can
serve any of them. Stages follow each other on one global step counter: pretraining takes
steps ``1..steps``, variant k the next ``finetune_steps``. Data parallelism: every worker draws
``ceil(batch / world_size)`` prompts per step from its own stream; DDP averages the gradients.
:func:`train_in_process` runs one stage in the calling process (the experiments' Ray tasks).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator

import torch

from nshot.errors import NshotError

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


def run_stage(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    opt: torch.optim.Optimizer,
    cfg: ICLFTConfig,
    *,
    seed: int,
    stage: str,
    stage_index: int,
    start: int,
    pool: tuple[torch.Tensor, torch.Tensor] | None = None,
    rank: int = 0,
    world: int = 1,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[int, torch.Tensor]]:
    """Iterations ``start..T-1`` of one stage; yields ``(t + 1, loss)`` after each update.

    ``model`` may be a DDP wrapper: it is called once per iteration (both prompts of the
    ZS+FS objective go through one forward call). The gradient norm is clipped jointly
    over ``params`` (the trainable matrices)."""
    T = cfg.steps if stage == "pretrain" else cfg.ft_steps
    per_rank = math.ceil(cfg.batch / world)
    objective = "pretrain" if stage == "pretrain" else parse_variant(stage)[0]
    stream = D.PRETRAIN if stage == "pretrain" else D.FINETUNE
    for t in range(start, T):
        gen = D.generator(seed, stream, stage_index, t, rank)
        if objective == "pretrain":
            Z, yq = D.pretrain_batch(cfg, per_rank, gen)
            loss = mse(model(Z.to(device)), yq.to(device))
        else:
            assert pool is not None
            Zz, Zf, yq = D.finetune_batch(pool[0], pool[1], per_rank, cfg.n_fs, gen)
            yq = yq.to(device)
            if objective == "zs":
                loss = mse(model(Zz.to(device)), yq)
            else:
                pz, pf = model(Zz.to(device), Zf.to(device))
                loss = mse(pz, yq) + fs_weight(cfg, t, T) * mse(pf, yq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        yield t + 1, loss.detach()


def make_optimizer(cfg: ICLFTConfig, params: list[torch.nn.Parameter]) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)


def train_in_process(
    net: LinearAttention, cfg: ICLFTConfig, seed: int, stage: str, *, progress: str | None = None
) -> list[float]:
    """Train ``net`` through one stage in this process (experiments' Ray tasks); loss curve."""
    pool = None
    index = cfg.stages().index(stage) if stage in cfg.stages() else 0
    if stage != "pretrain":
        x, y, _ = D.make_pool(cfg, seed)
        pool = (x, y)
    subset = "all" if stage == "pretrain" else parse_variant(stage)[1]
    params = set_trainable(net, subset)
    opt = make_optimizer(cfg, params)
    losses, window, t0 = [], [], time.time()
    for t, loss in run_stage(
        net, params, opt, cfg, seed=seed, stage=stage, stage_index=index, start=0, pool=pool
    ):
        window.append(loss)
        if t % cfg.log_every == 0 or t == (cfg.steps if stage == "pretrain" else cfg.ft_steps):
            losses.append(float(torch.stack(window).mean()))
            window = []
            if progress:
                _log(f"{progress}: step {t} loss {losses[-1]:.4g} ({time.time() - t0:.0f}s)")
    return losses


def train_loop(cfg: ICLFTConfig) -> None:
    """The Ray Train loop: pretraining, then each fine-tuning variant, on one step counter."""
    from nshot.train import session
    from nshot.train.checkpoint import load_checkpoint

    ctx = session.context()
    bounds = cfg.stage_bounds()
    rows = ["pretrained"] + [row_name(s) for s, _, _ in bounds[1:]]
    torch.manual_seed(cfg.seed)
    bundle = ICLFTBundle(cfg.d, rows, cfg.init_std).to(ctx.device)
    restored = session.restore(bundle)
    start = restored.step if restored else 0
    trained: list[str] = list(restored.extra.get("trained", [])) if restored else []
    if restored is None and cfg.init_checkpoint:
        init = load_checkpoint(cfg.init_checkpoint, method="iclft")
        pre, extra0 = load_model(init)
        if "pretrained" not in extra0.get("trained", []) or int(extra0["d"]) != cfg.d:
            raise NshotError(
                f"init_checkpoint {init.path}: no trained pretrained model of d = {cfg.d}"
            )
        bundle.models["pretrained"].load_state_dict(pre.models["pretrained"].state_dict())
        start, trained = bounds[0][2], ["pretrained"]
        _log(f"fine-tuning from the pretrained model of {init.path}")
    theta0 = D.target_task(cfg, cfg.seed)
    pool = None
    if cfg.stage == "finetune":
        x, y, _ = D.make_pool(cfg, cfg.seed)
        pool = (x, y)
    per_rank = math.ceil(cfg.batch / ctx.world_size)
    extra = {
        "d": cfg.d,
        "rows": rows,
        "variants": {
            r: "pretrained" if s == "pretrain" else s for r, (s, _, _) in zip(rows, bounds)
        },  # fmt: skip
        "theta0": theta0.tolist(),
        "sigma2": cfg.sigma2,
        # steps this run was resumed from (one entry per resume)
        "resumed_from": (list(restored.extra.get("resumed_from", [])) + [restored.step])
        if restored
        else [],
    }
    for k, (stage, s0, s1) in enumerate(bounds):
        if start >= s1:
            continue
        row = rows[k]
        net = bundle.models[row]
        if k > 0 and start == s0:  # a fine-tuning run starts from the pretrained weights
            net.load_state_dict(bundle.models["pretrained"].state_dict())
        subset = "all" if stage == "pretrain" else parse_variant(stage)[1]
        params = set_trainable(net, subset)
        model = session.prepare_model(net)  # DDP over the trainable matrices
        opt = make_optimizer(cfg, params)
        if restored is not None and s0 < restored.step < s1:  # mid-stage: momentum too
            session.restore(bundle, opt)
        if ctx.rank == 0:
            _log(f"stage {k} '{stage}' ({subset} trainable) from step {start - s0}")
        window: list[torch.Tensor] = []
        for t, loss in run_stage(
            model, params, opt, cfg, seed=cfg.seed, stage=stage, stage_index=k,
            start=start - s0, pool=pool, rank=ctx.rank, world=ctx.world_size,
            device=ctx.device,
        ):  # fmt: skip
            step = s0 + t
            session.maybe_inject_fault(step, restored)
            window.append(loss)
            done = step == s1
            is_ckpt = step % cfg.checkpoint_every == 0 or done
            if step % cfg.log_every == 0 or is_ckpt:
                metrics = {"loss": float(torch.stack(window).mean()), "stage": float(k)}
                metrics.update(validation(net, cfg, cfg.seed, theta0))
                session.report(
                    metrics, step=step, model=bundle, optimizer=opt,
                    extra={**extra, "stage": stage, "trained": trained + [row] * done},
                    checkpoint=is_ckpt, samples=per_rank * len(window),
                )  # fmt: skip
                window = []
        trained.append(row)
        start = s1
        for p in net.parameters():
            p.requires_grad_(False)
