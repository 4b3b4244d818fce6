"""iclft as an nshot Method: pretraining and fine-tuning under Ray Train, evaluation, serving.

One run (``train_loop``) pretrains the linear-attention model on random linear tasks and then
fine-tunes a copy of it per configured variant (``zs/v``, ``zs+fs/all``, ...) on the target
task θ0. All models live in one checkpoint (``models.<row>.{Q,K,V}``), so the predictor can
serve any of them. Stages follow each other on one global step counter: pretraining takes
steps ``1..steps``, variant k the next ``finetune_steps``. Data parallelism: every worker draws
``ceil(batch / world_size)`` prompts per step from its own stream; DDP averages the gradients.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from nshot.method import Method, NshotError, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, meta_counts

from . import data as D
from .claims import CLAIMS
from .config import ICLFTConfig, parse_variant, row_name
from .model import ICLFTBundle, LinearAttention, effective_params, mse, set_trainable


def _log(msg: str) -> None:
    print(f"[iclft] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- training core


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


def new_model(cfg: ICLFTConfig, seed: int) -> LinearAttention:
    torch.manual_seed(seed)
    return LinearAttention(cfg.d, cfg.init_std)


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


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def task_errors(
    net: LinearAttention, theta: torch.Tensor, ns: list[int], batch: int, sigma2: float,
    seed: int, task: int, chunk: int = 10_000,
) -> dict[int, float]:  # fmt: skip
    """Test MSE (float64) of ``net`` on task ``theta`` at each n, on fresh prompts of the
    evaluation stream ``(seed, EVAL, task, n)``. Large errors are reported as they are."""
    net64 = LinearAttention(net.d)
    net64.load_state_dict({k: v.detach().cpu() for k, v in net.state_dict().items()})
    net64 = net64.double()
    out = {}
    for n in ns:
        Z, yq = D.eval_batch(theta, n, batch, sigma2, D.generator(seed, D.EVAL, task, n))
        sq = torch.cat([(net64.predict(Z[i : i + chunk]) - yq[i : i + chunk]) ** 2
                        for i in range(0, batch, chunk)])  # fmt: skip
        out[n] = float(sq.mean())
    return out


def evaluate_model(
    net: LinearAttention, cfg: ICLFTConfig, seed: int, theta0: torch.Tensor, *, random: bool
) -> dict[str, float]:
    """``err_target_n{n}``, ``err_unseen_n{n}`` (and ``err_random_n{n}``, the mean over the
    held-out random tasks, when ``random``)."""
    out: dict[str, float] = {}
    for name, theta, task in (("target", theta0, D.TARGET), ("unseen", -theta0, D.UNSEEN)):
        for n, e in task_errors(net, theta, cfg.eval_n, cfg.eval_batch, cfg.sigma2, seed,
                                task).items():  # fmt: skip
            out[f"err_{name}_n{n}"] = e
    if random and cfg.eval_random_tasks:
        per = [
            task_errors(net, th, cfg.eval_n, max(1, cfg.eval_batch // 10), cfg.sigma2, seed, 2 + i)
            for i, th in enumerate(D.random_tasks(cfg, seed))
        ]
        for n in cfg.eval_n:
            out[f"err_random_n{n}"] = float(np.mean([p[n] for p in per]))
    return out


def summary(net: LinearAttention, theta0: torch.Tensor) -> dict[str, float]:
    """Interpretable effective parameters: ``w`` = tr(v_y·M_xx)/d (the ICL weight; c* = 0.79
    pretrained), ``g_theta0`` = θ0ᵀ M_xx v_x (1/(d+4) at the V-only ZS optimum), the
    off-diagonal share of M_xx and |M_00| (the constant–constant score, used by the
    all-parameter ZS family)."""
    p = effective_params(net)
    M, v = p["M"], p["v"]
    d = net.d
    Mxx = M[1 : d + 1, 1 : d + 1]
    off = Mxx - torch.diag(torch.diagonal(Mxx))
    return {
        "w": float(v[-1] * torch.trace(Mxx) / d),
        "g_theta0": float(theta0.double() @ (Mxx @ v[1 : d + 1])),
        "offdiag_share": float(off.norm() / Mxx.norm().clamp_min(1e-12)),
        "M00": float(M[0, 0]),
    }


@torch.no_grad()
def validation(net: LinearAttention, cfg: ICLFTConfig, seed: int, theta0: torch.Tensor) -> dict:
    errs = task_errors(net, theta0, [0, cfg.n_pt], cfg.val_batch, cfg.sigma2, seed, task=99)
    return {f"val_err_n{n}": e for n, e in errs.items()}


# --------------------------------------------------------------------------- checkpoints


def load_bundle(checkpoint: LoadedCheckpoint) -> tuple[ICLFTBundle, dict[str, Any]]:
    extra = checkpoint.extra
    if "rows" not in extra or "d" not in extra:
        raise NshotError(f"{checkpoint.path}: not an iclft checkpoint (no model list)")
    bundle = ICLFTBundle(int(extra["d"]), extra["rows"])
    try:
        bundle.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not match its model list: {err}") from None
    bundle.eval()
    return bundle, extra


# --------------------------------------------------------------------------- the Method


@register
class ICLFTMethod(Method):
    name = "iclft"
    paper = (
        "Fine-tuning versus in-context learning in linear attention "
        "(preserving ICL under fine-tuning; ICML 2026)"
    )
    area = "in-context (few-shot) learning / fine-tuning"
    version = "1"
    Config = ICLFTConfig
    claims = CLAIMS

    def data(self, cfg: ICLFTConfig) -> dict[str, pa.Table]:
        return D.tables(cfg)

    def train_loop(self, cfg: ICLFTConfig) -> None:
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
            init = load_checkpoint(cfg.init_checkpoint, method=self.name)
            pre, extra0 = load_bundle(init)
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

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: ICLFTConfig) -> dict[str, float]:
        bundle, extra = load_bundle(checkpoint)
        theta0 = torch.tensor(extra["theta0"], dtype=torch.float64)
        seed = int(checkpoint.config.get("seed", cfg.seed))
        cfg = cfg.replace(d=int(extra["d"]), sigma2=float(extra.get("sigma2", cfg.sigma2)))
        out: dict[str, float] = {}
        for row in extra.get("trained", []):
            net = bundle.models[row]
            for key, v in evaluate_model(net, cfg, seed, theta0, random=True).items():
                out[f"{row}/{key}"] = v
        return out

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import ICLFTPredictor

        return ICLFTPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: ICLFTConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """One linear-attention model of width ``d + 2`` per recorded row (else per variant and
        the pretrained one); activations: ``MAX_CONTEXT`` context tokens and ``MAX_QUERIES``
        queries of one request, a few copies each, and one ``(d+2)²`` matrix per model."""
        from . import serve

        extra = extra or {}
        d = extra.get("d", cfg.d)
        rows = extra.get("rows", ["pretrained", *(row_name(v) for v in cfg.variants)])
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 256:
            raise ValueError(f"extra.d must be an integer in [1, 256], got {d!r}")
        if (
            not isinstance(rows, list)
            or not 1 <= len(rows) <= 64
            or not all(isinstance(r, str) and r for r in rows)
        ):
            raise ValueError("extra.rows must be a list of 1 to 64 model names")
        params, state = meta_counts(lambda: ICLFTBundle(d, rows))
        tokens = serve.MAX_CONTEXT + serve.MAX_QUERIES
        act = 4 * (8 * tokens * (d + 2) + len(rows) * 4 * (d + 2) ** 2)
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def experiments(self, cfg: ICLFTConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
