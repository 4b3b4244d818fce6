"""Meta-training with persistent per-instance latents (the paper's alternating auto-decoding).

::

    z^(k) = 0 for every training instance, persistent (never reset unless reset_latents)
    for outer step 1..N_out:
        B = random batch of training instances
        for inner step 1..N_in:  z^(k) ← z^(k) − η_in clip(∇_z [L_symp^(k) + λ_z‖z^(k)‖])  (base fixed)
        base ← Adam step on Σ_{k∈B} L_symp^(k) + λ_φ‖φ‖ + λ_orth·orthogonality          (z fixed)

The latent gradient is clipped per instance to norm ``latent_clip`` (a safeguard, inactive in
normal steps: MR's modulation U(z)V(z)ᵀ is quadratic in z and one large step can otherwise send a
latent to 10⁶). The latents live in their own table (a buffer of ``MetaState``, outside the base's Adam) with
their own plain SGD step. With several Ray Train workers the training instances are sharded by
rank (instance k belongs to rank k mod world): each worker updates only its own latents, the
base's gradients are averaged by DDP, and the latent tables are summed across ranks before a
checkpoint so that rank 0 saves every instance's latent.

``L_symp^(k)`` is instance k's squared error reweighted to the scale of an average instance,
``C · mean‖F̂ − F‖² / mean_k‖F‖²`` with ``C`` the mean ‖F‖² of the training split (a
reconstruction: parameter values change the pendulum field's scale by 16×; the reweighting
weighs every instance alike, like the relative metrics, while the loss keeps the data's units, so
that the paper's η_in and λ values keep their meaning). Reports show the relative part.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from nshot.errors import NshotError
from nshot.train.trainer import Recipe
from nshot.train.trainer import train as train_recipe

from .config import ModHNNConfig
from .model import Dynamics, DynSpec, MetaState, relative_loss
from .systems import Split, get_system


def make_spec(
    cfg: ModHNNConfig, train: Split, *, kind: str = "hnn", modulation: str | None = None
) -> DynSpec:
    """The network spec for ``cfg`` with input/output scales measured on ``train``."""
    x = train.x.reshape(-1, 2)
    f = train.f.reshape(-1, 2)
    x_scale = np.sqrt((x**2).mean(0))
    f_scale = np.sqrt((f**2).mean(0))
    # H̃ = h_scale·net: ∂H̃/∂p ≈ h_scale/x_p, ∂H̃/∂q ≈ h_scale/x_q; match both on average
    h_scale = float(np.sqrt(f_scale[0] * x_scale[1] * f_scale[1] * x_scale[0]))
    return DynSpec(
        kind=kind,
        modulation=modulation or cfg.modulation,
        width=cfg.width,
        depth=cfg.depth,
        d_z=cfg.d_z,
        rank=cfg.rank,
        dissipative=get_system(train.system).dissipative and kind == "hnn",
        x_scale=[float(v) for v in x_scale],
        f_scale=[float(v) for v in f_scale],
        h_scale=h_scale,
        loss_scale=float((f**2).sum(-1).mean()),
    )


def latent_norm(z: torch.Tensor) -> torch.Tensor:
    """``‖z‖₂`` per row, smooth at 0 (the gradient at z = 0 is 0, not NaN)."""
    return torch.sqrt(z.pow(2).sum(-1) + 1e-12)


@dataclass
class StepStats:
    loss: float  # mean L_symp over the batch after the inner steps
    inner_first: float  # mean L_symp before the inner steps


class MetaTrainer:
    """One worker's view of meta-training; ``step`` runs one outer step.

    ``fn`` is the network call the base step goes through (the DDP wrapper on a worker group,
    else the module itself); the inner latent steps call the unwrapped module.
    """

    def __init__(
        self,
        cfg: ModHNNConfig,
        state: MetaState,
        train: Split,
        *,
        fn: Callable[..., torch.Tensor] | None = None,
        rank: int = 0,
        world: int = 1,
        device: torch.device | None = None,
    ) -> None:
        self.cfg = cfg
        self.state = state
        self.dyn = state.dyn
        self.fn = fn or self.dyn
        self.rank, self.world = rank, world
        dev = device or torch.device("cpu")
        K = train.n_instances
        self.X = torch.as_tensor(train.x.reshape(K, -1, 2), dtype=torch.float32, device=dev)
        self.F = torch.as_tensor(train.f.reshape(K, -1, 2), dtype=torch.float32, device=dev)
        self.owned = np.arange(K)[np.arange(K) % world == rank]
        if len(self.owned) == 0:
            raise ValueError(f"n_train_instances: {K} instances for {world} workers")
        self.batch = max(1, min(cfg.batch_instances // world, len(self.owned)))
        self.epoch_steps = int(np.ceil(len(self.owned) / self.batch))
        self.opt = torch.optim.Adam(self.dyn.parameters(), lr=cfg.lr)
        self.scale = float(self.dyn.spec.loss_scale)

    def _points(
        self, idx: np.ndarray, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        X, F = self.X[idx], self.F[idx]
        n = self.cfg.points_per_instance
        if n and n < X.shape[1]:
            sel = torch.as_tensor(rng.choice(X.shape[1], n, replace=False))
            X, F = X[:, sel], F[:, sel]
        return X, F

    def step(self, step: int, seed: int) -> StepStats:
        cfg = self.cfg
        if cfg.reset_latents and (step - 1) % self.epoch_steps == 0:
            self.state.latents.zero_()  # the per-epoch-reset ablation
        rng = np.random.default_rng([seed, step, self.rank])
        idx = rng.choice(self.owned, self.batch, replace=False)
        X, F = self._points(idx, rng)
        self.dyn.train()
        first = float("nan")
        z: torch.Tensor | None = None
        if self.dyn.uses_latent:
            it = torch.as_tensor(idx, device=self.X.device)
            z = self.state.latents[it].clone()
            for i in range(cfg.n_inner):
                z.requires_grad_(True)
                per = relative_loss(self.dyn.field(X, z, create_graph=True), F)
                if i == 0:
                    first = float(per.mean().detach())
                obj = self.scale * per.sum() + cfg.lambda_z * latent_norm(z).sum()
                (gz,) = torch.autograd.grad(obj, z)
                if cfg.latent_clip > 0:  # a quadratic modulation (MR) can blow a latent up
                    norm = gz.norm(dim=-1, keepdim=True)
                    gz = gz * (cfg.latent_clip / norm.clamp_min(cfg.latent_clip))
                z = (z - cfg.lr_inner * gz).detach()
            self.state.latents[it] = z
        per = relative_loss(self.dyn.field(X, z, create_graph=True, fn=self.fn), F)
        loss = self.scale * per.sum()
        net = self.dyn.net
        if cfg.lambda_phi > 0 and net.hyper:
            loss = loss + cfg.lambda_phi * net.hyper_norm()
        if cfg.lambda_orth > 0 and len(net.bases_u):
            loss = loss + cfg.lambda_orth * net.orthogonality()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            nn.utils.clip_grad_norm_(self.dyn.parameters(), cfg.grad_clip)
        self.opt.step()
        mean = float(per.mean().detach())
        return StepStats(mean, first if first == first else mean)

    def gather_latents(self) -> None:
        """Sum the latent tables across ranks (each rank owns disjoint rows)."""
        if self.world <= 1:
            return
        import torch.distributed as dist

        lat = self.state.latents
        mask = torch.zeros(lat.shape[0], 1, device=lat.device)
        mask[torch.as_tensor(self.owned)] = 1.0
        full = lat * mask
        dist.all_reduce(full)
        lat.copy_(full)


class ModHNNRecipe(Recipe):
    """Meta-training as :mod:`nshot.train.trainer` runs it: one :class:`MetaTrainer` outer step
    per step (its own Adam on the base, plain SGD on the latents); the checkpoint is the
    :class:`MetaState` (base, hypernetwork and the training latents) with the base's Adam.
    Reports the mean L_symp of the steps since the last report and the mean latent norm.

    Given ``train`` (and ``kind``/``modulation``/``seed``), a row of the experiments trained
    in-process; ``progress(step, loss)`` sees every report."""

    def __init__(
        self,
        cfg: ModHNNConfig,
        train: Split | None = None,
        *,
        kind: str | None = None,
        modulation: str | None = None,
        seed: int | None = None,
        progress: Callable[[int, float], None] | None = None,
    ) -> None:
        super().__init__(cfg)
        self.train_split = train
        self.kind = kind or cfg.model_kind
        self.modulation = modulation
        self.seed = cfg.seed if seed is None else seed
        self.progress = progress

    def build(self) -> None:
        cfg = self.cfg
        n_test = None
        if self.train_split is None:
            from .data import load_splits

            self.train_split, test = load_splits(cfg)
            n_test = test.n_instances
        train = self.train_split
        if train.n_instances < self.world_size:
            raise NshotError(
                f"n_train_instances: {train.n_instances} instances for {self.world_size} workers"
            )
        torch.manual_seed(self.seed)
        self.spec = make_spec(cfg, train, kind=self.kind, modulation=self.modulation)
        self.model = state = MetaState(Dynamics(self.spec), train.n_instances)
        self.forward = state.dyn  # the base step's call (DDP-wrapped on a worker group)
        state.to(self.device)
        self.trainer = MetaTrainer(
            cfg, state, train, rank=self.rank, world=self.world_size, device=self.device
        )
        self.optimizer = self.trainer.opt
        self.samples_per_step = self.trainer.batch
        self.instances = {"train": train.n_instances, "test": n_test}
        self.window: list[float] = []
        self.t_last = time.time()
        self.curve: list[float] = []

    def schedule(self) -> tuple[int, int, int]:
        steps, log_every, checkpoint_every = super().schedule()
        if not self.session:  # in-process: a curve point every log_every, none at checkpoints
            checkpoint_every = steps
        return steps, log_every, checkpoint_every

    def step(self, step: int) -> dict[str, float]:
        self.trainer.fn = self.forward
        loss = self.trainer.step(step, self.seed).loss
        self.window.append(loss)
        return {"loss": loss}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        if self.is_checkpoint(step):
            self.trainer.gather_latents()  # every instance's latent, on every rank
        loss = float(np.mean(self.window))
        metrics = {
            "loss": loss,
            "latent_norm": float(self.model.latents.norm(dim=-1).mean()),
            "step_s": (time.time() - self.t_last) / max(len(self.window), 1),
        }
        self.window = []
        self.t_last = time.time()
        self.curve.append(loss)
        if self.progress is not None:
            self.progress(step, loss)
        return metrics

    def extra(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "system": self.cfg.system,
                "instances": self.instances}  # fmt: skip


def meta_train(
    cfg: ModHNNConfig,
    train: Split,
    *,
    kind: str = "hnn",
    modulation: str | None = None,
    seed: int | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[MetaState, list[float]]:
    """Meta-train in-process (one worker, the recipe ``train_loop`` runs): used by
    ``experiments()``; returns the state (in eval mode) and the reported loss curve."""
    recipe = ModHNNRecipe(cfg, train, kind=kind, modulation=modulation, seed=seed,
                          progress=progress)  # fmt: skip
    train_recipe(recipe, session=False)
    recipe.model.eval()
    return recipe.model, recipe.curve


def state_dict_numpy(state: nn.Module) -> dict[str, Any]:
    return {k: v.detach().cpu().numpy() for k, v in state.state_dict().items()}


def train_loop(cfg: ModHNNConfig) -> None:
    """Meta-training under Ray Train on ``cfg.system``: one ``MetaTrainer`` per worker, training
    instances sharded by rank, the base's gradients averaged by DDP; reports the mean
    L_symp every ``log_every`` outer steps and checkpoints base, hypernetwork and the
    training latents every ``checkpoint_every``."""
    train_recipe(ModHNNRecipe(cfg))
