"""Modulated energy networks (the paper's method section), and the loader of a checkpoint.

``ModulatedMLP`` is the shared base network ``h_ℓ = tanh(W_mod h_{ℓ−1} + b + s)`` with every
modulation variant generated from a per-instance latent ``z`` by a linear hypernetwork:

=============  ===============================================================================
``none``       the plain network (z is ignored): the per-instance and pooled HNN baselines
``shift``      ``s^(ℓ) = A_ℓ z``
``full_weight`` CoDA: ``W + ΔW(z)``, ``b + Δb(z)`` with ``θ_k = θ_c + W ξ_k`` (every hidden weight)
``mr``         multi-rank MR(r): ``W + U(z) V(z)ᵀ`` with ``U, V ∈ R^{w×r}`` and a shift ``s(z)``
``svd``        SVD(r): ``W + Σ_i relu(d_i(z)) u_i v_iᵀ`` with shared bases ``u_i, v_i`` and ``s(z)``;
               the bases carry the soft-orthogonality penalty ``‖UᵀU − I‖_F + ‖VᵀV − I‖_F``
``film``       FiLM: ``tanh((1 + γ(z)) ⊙ (W h + b) + β(z))``
``concat``     context concatenation: input ``[q, p, z]``
=============  ===============================================================================

``Dynamics`` turns the network into a vector field: ``kind="hnn"`` reads the scalar output as the
energy ``H̃(q, p; z)`` and returns the symplectic gradient ``(∂H̃/∂p, −∂H̃/∂q)`` through autograd
(``create_graph=True`` while training); ``kind="mlp"`` is the non-structured control, a network
that outputs ``(q̇, ṗ)`` directly with the same modulation. With ``dissipative=True`` an HNN adds a
latent-modulated damping ``ṗ −= D(z) ∂H̃/∂p`` with ``D = softplus(·) ≥ 0`` (energy can only decay:
``dH̃/dt = −D (∂H̃/∂p)² ≤ 0``), for the dissipative system.

Fixed, data-independent-per-instance scalings (``x_scale``, ``h_scale``, ``f_scale``, measured on
the training split and stored as buffers) make the inputs and outputs O(1); they are constants,
so the symplectic structure in the original coordinates is exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from nshot.errors import NshotError

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint

VARIANTS = ("none", "shift", "full_weight", "mr", "svd", "film", "concat")
KINDS = ("hnn", "mlp")


@dataclass
class DynSpec:
    """Everything needed to rebuild a ``Dynamics`` (stored as JSON in checkpoints)."""

    kind: str = "hnn"
    modulation: str = "svd"
    width: int = 64
    depth: int = 2
    d_z: int = 4
    rank: int = 3
    dissipative: bool = False
    x_scale: list[float] = field(default_factory=lambda: [1.0, 1.0])
    f_scale: list[float] = field(default_factory=lambda: [1.0, 1.0])
    h_scale: float = 1.0
    # mean ‖F‖² of the training data: the relative loss times this is in the data's own units
    loss_scale: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DynSpec:
        return cls(**d)


class ModulatedMLP(nn.Module):
    """``[B, N, in] × z [B, d_z] → [B, N, out]``; every instance ``b`` has its own modulation."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        width: int,
        depth: int,
        modulation: str,
        d_z: int,
        rank: int,
        out_bias: bool = True,
    ) -> None:
        super().__init__()
        if modulation not in VARIANTS:
            raise ValueError(
                f"modulation: unknown variant {modulation!r}; choose one of {VARIANTS}"
            )
        self.modulation = modulation
        self.d_z = d_z
        self.width = width
        first = in_dim + (d_z if modulation == "concat" else 0)
        self.dims = [first] + [width] * depth
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i in range(depth):
            w = torch.empty(self.dims[i + 1], self.dims[i])
            nn.init.xavier_normal_(w, gain=1.0)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(self.dims[i + 1])))
        self.out = nn.Linear(width, out_dim, bias=out_bias)
        self.ranks = [min(rank, self.dims[i], self.dims[i + 1]) for i in range(depth)]
        self.hyper = nn.ModuleDict()
        self.bases_u = nn.ParameterList()
        self.bases_v = nn.ParameterList()
        for i in range(depth):
            n_in, n_out, r = self.dims[i], self.dims[i + 1], self.ranks[i]
            heads: dict[str, tuple[int, bool, float]] = {}  # name: (size, bias, init std)
            if modulation in ("shift", "mr", "svd"):
                heads["s"] = (n_out, False, 0.1)
            if modulation == "full_weight":
                heads["dw"] = (n_out * n_in, False, 0.1 / math.sqrt(n_in))
                heads["db"] = (n_out, False, 0.1)
            if modulation == "mr":
                heads["u"] = (n_out * rank, True, 0.3)
                heads["v"] = (n_in * rank, True, 0.3 / math.sqrt(n_in))
            if modulation == "svd":
                heads["d"] = (r, True, 0.1)
                u = torch.linalg.qr(torch.randn(n_out, r))[0]
                v = torch.linalg.qr(torch.randn(n_in, r))[0]
                self.bases_u.append(nn.Parameter(u))
                self.bases_v.append(nn.Parameter(v))
            if modulation == "film":
                heads["gamma"] = (n_out, False, 0.1)
                heads["beta"] = (n_out, False, 0.1)
            for name, (size, bias, std) in heads.items():
                lin = nn.Linear(d_z, size, bias=bias)
                nn.init.normal_(lin.weight, std=std / math.sqrt(max(d_z, 1)))
                if bias:
                    if name == "d":
                        nn.init.constant_(lin.bias, 0.1)
                    else:
                        nn.init.normal_(lin.bias, std=std)
                self.hyper[f"{i}_{name}"] = lin
        self.rank = rank

    # ------------------------------------------------------------------ modulations
    def modulations(self, z: torch.Tensor | None) -> list[dict[str, torch.Tensor]]:
        """Per layer, the modulation tensors generated from ``z [B, d_z]`` (``f_hyper(z; φ)``)."""
        mods: list[dict[str, torch.Tensor]] = []
        if self.modulation in ("none", "concat"):
            return [{} for _ in self.weights]
        assert z is not None
        B = z.shape[0]
        for i in range(len(self.weights)):
            n_in, n_out, r = self.dims[i], self.dims[i + 1], self.ranks[i]
            m: dict[str, torch.Tensor] = {}
            for name in ("s", "db", "gamma", "beta"):
                if f"{i}_{name}" in self.hyper:
                    m[name] = self.hyper[f"{i}_{name}"](z)
            if self.modulation == "full_weight":
                m["dw"] = self.hyper[f"{i}_dw"](z).view(B, n_out, n_in)
            if self.modulation == "mr":
                m["u"] = self.hyper[f"{i}_u"](z).view(B, n_out, self.rank)
                m["v"] = self.hyper[f"{i}_v"](z).view(B, n_in, self.rank)
            if self.modulation == "svd":
                m["d"] = torch.relu(self.hyper[f"{i}_d"](z))  # non-negative coefficients
                assert m["d"].shape[-1] == r
            mods.append(m)
        return mods

    def zero_modulations(self, batch: int) -> list[dict[str, torch.Tensor]]:
        """Modulations that are all zero (d = 0, s = 0, ΔW = 0, ...): the base network."""
        if self.modulation in ("none", "concat"):
            return [{} for _ in self.weights]
        z = torch.zeros(batch, self.d_z, dtype=self.out.weight.dtype)
        return [{k: torch.zeros_like(v) for k, v in m.items()} for m in self.modulations(z)]

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x: torch.Tensor,
        z: torch.Tensor | None = None,
        mods: list[dict[str, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        if self.modulation == "concat":
            assert z is not None
            x = torch.cat([x, z[:, None, :].expand(-1, x.shape[1], -1).to(x.dtype)], dim=-1)
        if mods is None:
            mods = self.modulations(z)
        h = x
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            m = mods[i]
            a = h @ w.T + b  # [B, N, out]
            if "dw" in m:
                a = a + torch.einsum("bni,boi->bno", h, m["dw"])
            if "u" in m:  # h V U^T
                a = a + torch.einsum(
                    "bnr,bor->bno", torch.einsum("bni,bir->bnr", h, m["v"]), m["u"]
                )
            if "d" in m:  # h V diag(d) U^T with shared bases
                hv = (h @ self.bases_v[i]) * m["d"][:, None, :]
                a = a + hv @ self.bases_u[i].T
            if "db" in m:
                a = a + m["db"][:, None, :]
            if "s" in m:
                a = a + m["s"][:, None, :]
            if "gamma" in m:
                a = (1 + m["gamma"][:, None, :]) * a + m["beta"][:, None, :]
            h = torch.tanh(a)
        return self.out(h)

    # ------------------------------------------------------------------ penalties
    def hyper_norm(self) -> torch.Tensor:
        """``‖φ‖₂`` over the hypernetwork's weight matrices (not its biases)."""
        sq = [lin.weight.pow(2).sum() for lin in self.hyper.values()]
        if not sq:
            return self.out.weight.new_zeros(())
        return torch.sqrt(torch.stack(sq).sum() + 1e-12)

    def orthogonality(self) -> torch.Tensor:
        """``Σ_ℓ ‖UᵀU − I‖_F + ‖VᵀV − I‖_F`` on the shared SVD bases (0 for other variants)."""
        total = self.out.weight.new_zeros(())
        for u, v in zip(self.bases_u, self.bases_v):
            eye = torch.eye(u.shape[1], dtype=u.dtype, device=u.device)
            total = (
                total
                + torch.linalg.matrix_norm(u.T @ u - eye)
                + torch.linalg.matrix_norm(v.T @ v - eye)
            )
        return total


def symplectic_gradient(
    energy: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, create_graph: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``((∂H/∂p, −∂H/∂q), ∇H)`` of ``energy(x) [..., N]`` at states ``x [..., N, 2]`` (autograd)."""
    with torch.enable_grad():
        if not x.requires_grad:
            x = x.detach().requires_grad_(True)
        H = energy(x)
        (g,) = torch.autograd.grad(H.sum(), x, create_graph=create_graph)
    return torch.stack([g[..., 1], -g[..., 0]], dim=-1), g


class Dynamics(nn.Module):
    """A (modulated) learned vector field. ``forward`` is the network call DDP wraps: the scaled
    energy ``H̃ [B, N]`` for an HNN, the field ``[B, N, 2]`` for the unstructured MLP."""

    def __init__(self, spec: DynSpec) -> None:
        super().__init__()
        if spec.kind not in KINDS:
            raise ValueError(f"kind: unknown model kind {spec.kind!r}; choose one of {KINDS}")
        self.spec = spec
        out = 1 if spec.kind == "hnn" else 2
        # an energy's constant offset does not enter the dynamics (and DDP wants every parameter
        # to receive a gradient), so the HNN's output layer has no bias
        self.net = ModulatedMLP(
            2, out, spec.width, spec.depth, spec.modulation, spec.d_z, spec.rank,
            out_bias=spec.kind == "mlp",
        )  # fmt: skip
        self.register_buffer("x_scale", torch.tensor(spec.x_scale, dtype=torch.float32))
        self.register_buffer("f_scale", torch.tensor(spec.f_scale, dtype=torch.float32))
        self.register_buffer("h_scale", torch.tensor(float(spec.h_scale), dtype=torch.float32))
        self.damp: nn.Linear | None = None
        if spec.dissipative:
            self.damp = nn.Linear(max(spec.d_z, 1), 1)
            nn.init.normal_(self.damp.weight, std=0.01)
            nn.init.constant_(self.damp.bias, -2.0)

    @property
    def uses_latent(self) -> bool:
        return self.spec.modulation != "none"

    def forward(
        self,
        x: torch.Tensor,
        z: torch.Tensor | None = None,
        mods: list[dict[str, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        out = self.net(x / self.x_scale, z, mods=mods)
        if self.spec.kind == "hnn":
            return self.h_scale * out[..., 0]
        return out * self.f_scale

    def energy(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if self.spec.kind != "hnn":
            raise ValueError("kind: the unstructured MLP has no energy")
        return self(x, z)

    def damping(self, z: torch.Tensor | None, batch: int, like: torch.Tensor) -> torch.Tensor:
        assert self.damp is not None
        zz = z if z is not None else like.new_zeros(batch, self.damp.in_features)
        return nn.functional.softplus(self.damp(zz.to(like.dtype)))  # [B, 1]

    def field(
        self,
        x: torch.Tensor,
        z: torch.Tensor | None = None,
        *,
        create_graph: bool = False,
        fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``(q̇, ṗ) [B, N, 2]`` at ``x [B, N, 2]``; ``fn`` replaces ``self`` (a DDP wrapper)."""
        if fn is None and z is not None and not torch.is_grad_enabled() and not create_graph:
            # evaluation: generate the modulations once, not per autograd call
            mods = self.net.modulations(z) if self.spec.modulation != "concat" else None

            def fn(s: torch.Tensor, zz: torch.Tensor | None) -> torch.Tensor:
                return self(s, zz, mods)

        fn = fn or self
        if self.spec.kind == "mlp":
            out = fn(x, z)
            return out if create_graph else out.detach()
        f, g = symplectic_gradient(lambda s: fn(s, z), x, create_graph=create_graph)
        if self.damp is not None:
            d = self.damping(z, x.shape[0], x)[:, None, :]  # [B, 1, 1]
            f = torch.cat([f[..., :1], f[..., 1:] - d * g[..., 1:]], dim=-1)
        return f if create_graph else f.detach()


def relative_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per instance ``mean ‖F̂ − F‖² / mean ‖F‖²`` over its samples: ``[B, N, 2] → [B]``."""
    num = (pred - target).pow(2).sum(-1).mean(-1)
    den = target.pow(2).sum(-1).mean(-1).clamp_min(1e-12)
    return num / den


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --------------------------------------------------------------------------- integrators


def rk4(
    f: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, dt: float, steps: int
) -> torch.Tensor:
    """Classical RK4: states ``[..., steps + 1, 2]`` starting at ``x0 [..., 2]``."""
    xs = [x0]
    x = x0
    for _ in range(steps):
        k1 = f(x)
        k2 = f(x + 0.5 * dt * k1)
        k3 = f(x + 0.5 * dt * k2)
        k4 = f(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        xs.append(x)
    return torch.stack(xs, dim=-2)


def implicit_midpoint(
    f: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    dt: float,
    steps: int,
    iters: int = 5,
    tol: float = 0.0,
    max_iters: int = 50,
) -> torch.Tensor:
    """The implicit midpoint rule ``x⁺ = x + dt f((x + x⁺)/2)``, symplectic for any H̃.

    Solved by fixed-point iteration from the explicit-midpoint (RK2) guess: ``iters`` iterations
    (``tol = 0``), or at least ``iters`` and then on (up to ``max_iters``) while the update is
    larger than ``tol``.
    """
    xs = [x0]
    x = x0
    for _ in range(steps):
        nxt = x + dt * f(x + 0.5 * dt * f(x))  # explicit-midpoint predictor (second order)
        for it in range(max(iters, 1) if tol <= 0 else max_iters):
            new = x + dt * f(0.5 * (x + nxt))
            delta = float((new - nxt).abs().max())
            nxt = new
            if tol > 0 and it + 1 >= iters and delta <= tol:
                break
        x = nxt
        xs.append(x)
    return torch.stack(xs, dim=-2)


class MetaState(nn.Module):
    """What a meta-training checkpoint holds: the dynamics (base + hypernetwork) and the table
    of training latents (a buffer: saved and restored with the weights, never in Adam)."""

    def __init__(self, dyn: Dynamics, n_instances: int) -> None:
        super().__init__()
        self.dyn = dyn
        self.register_buffer("latents", torch.zeros(n_instances, max(dyn.spec.d_z, 1)))

    def z_avg(self) -> torch.Tensor:
        """The mean of the (final) training latents: the adaptation's starting point."""
        return self.latents.mean(0)


def load_model(checkpoint: LoadedCheckpoint) -> tuple[MetaState, str]:
    """The trained ``MetaState`` (dynamics + training latents, in eval mode) of a modhnn
    checkpoint and the system it was trained on."""
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
