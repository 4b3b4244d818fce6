"""modhnn as an nshot Method: meta-training under Ray Train, evaluation, serving, experiments."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from nshot.method import Method, NshotError, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, bounded_ints, meta_counts

from .claims import CLAIMS
from .config import ModHNNConfig
from .model import Dynamics, DynSpec
from .train import MetaState, MetaTrainer, make_spec

#: what the network spec recorded in a modhnn checkpoint may be (every preset is far inside)
SPEC_BOUNDS = {"width": (1, 4096), "depth": (1, 32), "d_z": (0, 1024), "rank": (0, 1024)}


@register
class ModHNNMethod(Method):
    name = "modhnn"
    paper = "Modulation-based meta-learning of Hamiltonian dynamics (ICML 2026)"
    area = "few-shot system identification / structure-preserving dynamics"
    version = "1"
    Config = ModHNNConfig
    claims = CLAIMS

    def data(self, cfg: ModHNNConfig) -> dict[str, pa.Table]:
        from .data import split_table

        return {s: split_table(cfg, cfg.system, s) for s in ("train", "test")}

    def train_loop(self, cfg: ModHNNConfig) -> None:
        """Meta-training (spec §2) on ``cfg.system``: one ``MetaTrainer`` per worker, training
        instances sharded by rank, the base's gradients averaged by DDP; reports the mean
        L_symp every ``log_every`` outer steps and checkpoints base, hypernetwork and the
        training latents every ``checkpoint_every``."""
        from nshot.train import session

        from .data import load_splits

        ctx = session.context()
        train, test = load_splits(cfg)
        if train.n_instances < ctx.world_size:
            raise NshotError(
                f"n_train_instances: {train.n_instances} instances for {ctx.world_size} workers"
            )
        torch.manual_seed(cfg.seed)
        spec = make_spec(cfg, train, kind=cfg.model_kind)
        state = MetaState(Dynamics(spec), train.n_instances)
        ddp = session.prepare_model(state.dyn)
        state.to(ctx.device)
        trainer = MetaTrainer(
            cfg, state, train, fn=ddp, rank=ctx.rank, world=ctx.world_size, device=ctx.device
        )
        restored = session.restore(state, trainer.opt)
        start = restored.step if restored else 0
        extra = {
            "spec": spec.to_dict(),
            "system": cfg.system,
            "instances": {"train": train.n_instances, "test": test.n_instances},
        }
        window: list[float] = []
        t_last = time.time()
        for step in range(start + 1, cfg.steps + 1):
            session.maybe_inject_fault(step, restored)
            window.append(trainer.step(step, cfg.seed).loss)
            is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
            if step % cfg.log_every == 0 or is_ckpt:
                if is_ckpt:
                    trainer.gather_latents()  # every instance's latent, on every rank
                metrics = {
                    "loss": float(np.mean(window)),
                    "latent_norm": float(state.latents.norm(dim=-1).mean()),
                    "step_s": (time.time() - t_last) / max(len(window), 1),
                }
                window = []
                t_last = time.time()
                session.report(
                    metrics,
                    step=step,
                    model=state,
                    optimizer=trainer.opt,
                    extra=extra,
                    checkpoint=is_ckpt,
                    samples=trainer.batch,
                )

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: ModHNNConfig) -> dict[str, float]:
        """Adapt z to each unseen test instance from its shots and report the spec's metrics
        (means over test instances; ``*_zero_init``: the same from z = 0)."""
        from .adapt import adapt_latent, evaluate_dynamics, shots_of
        from .data import load_splits

        state, system = load_state(checkpoint)
        data_cfg = cfg.replace(system=system)
        _, test = load_splits(data_cfg)
        sx, sf = shots_of(test, cfg.shots)
        X = torch.as_tensor(sx, dtype=torch.float32)
        F = torch.as_tensor(sf, dtype=torch.float32)
        dyn = state.dyn
        out: dict[str, float] = {}
        inits = {"": state.z_avg(), "_zero_init": torch.zeros_like(state.z_avg())}
        for suffix, z0 in inits.items():
            z = None
            if dyn.uses_latent:
                z, fit = adapt_latent(
                    dyn, X, F, z0.expand(test.n_instances, -1), steps=cfg.adapt_steps,
                    lr=cfg.adapt_lr, lambda_z=cfg.lambda_z,
                )  # fmt: skip
                out[f"fit_loss{suffix}"] = float(fit.mean())
            ev = evaluate_dynamics(data_cfg, test, [dyn], z, keep_rollouts=0)
            for k, v in ev.means().items():
                out[f"{k}{suffix}"] = v
            if not dyn.uses_latent:
                break
        return out

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import ModHNNPredictor

        return ModHNNPredictor(checkpoint)

    def model_budget(self, cfg: ModHNNConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """The dynamics of the recorded spec (else the config's sizes), counted on the meta
        device, plus the table of training latents (its row count is read from the weights,
        so the weights' size is not checked); activations: a request's shots and states
        through ``depth`` layers of ``width``, with the gradient the Hamiltonian needs."""
        from . import serve

        spec = (extra or {}).get("spec")
        if spec is None:
            spec = {"width": cfg.width, "depth": cfg.depth, "d_z": cfg.d_z, "rank": cfg.rank}
        sizes = bounded_ints(spec, SPEC_BOUNDS, "extra.spec")
        dspec = DynSpec.from_dict(spec) if (extra or {}).get("spec") else DynSpec(
            kind="hnn", modulation=cfg.modulation, **sizes
        )  # fmt: skip
        params, _ = meta_counts(lambda: Dynamics(dspec))
        instances = (extra or {}).get("instances", {})
        n = instances.get("train", 0) if isinstance(instances, dict) else 0
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
        params += n * max(sizes["d_z"], 1)
        rows = serve.MAX_SHOTS + serve.MAX_STATES
        act = 4 * 16 * rows * (sizes["width"] + sizes["rank"]) * (sizes["depth"] + 2)
        return ModelBudget(params=params, activation_bytes=act)

    def experiments(self, cfg: ModHNNConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)


def load_state(checkpoint: LoadedCheckpoint) -> tuple[MetaState, str]:
    """The trained ``MetaState`` (dynamics + training latents) and its system."""
    extra = checkpoint.extra
    if "spec" not in extra:
        raise NshotError(f"{checkpoint.path}: not a modhnn checkpoint (no network spec)")
    spec = DynSpec.from_dict(extra["spec"])
    n = int(extra.get("instances", {}).get("train", 0))
    weights = checkpoint.weights()
    if "latents" in weights:
        n = int(weights["latents"].shape[0])
    state = MetaState(Dynamics(spec), n)
    state.load_state_dict(weights)
    state.eval()
    return state, str(extra.get("system", checkpoint.config.get("system", "pendulum")))


def describe_state(state: MetaState) -> dict[str, Any]:
    spec = state.dyn.spec
    return {"kind": spec.kind, "modulation": spec.modulation, "d_z": spec.d_z}
