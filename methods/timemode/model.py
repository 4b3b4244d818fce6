"""TimeMoDE's denoiser: a Diffusion Transformer whose MLPs are a Mixture of Domain Experts
(paper §3), and the DDPM around it.

* Tokens: one per time step (patch 1), ``Linear(C → d)`` plus sin-cos positions.
* Conditioning ``c = MLP(sinusoidal(t))``; every block is adaLN-Zero on ``c`` (DiT): the six
  modulations come from a zero-initialised ``Linear(d → 6d)``, and the output layer is zero
  too, so ε̂ ≡ 0 at initialisation.
* Domain Prompt (paper §3.2): ``DP = mean_L(Linear(Conv1d(x_ex)) + PE)`` of a **clean**
  exemplar window of the sample's own domain; noised tokens alone cannot tell datasets apart.
* MoDE (paper §3.3): K routed experts (top-k per token) plus one always-on shared expert. The
  router's logit for expert i is the energy of DP in expert i's prototype subspace,
  Σ_j ⟨P_i^j, DP⟩², plus a token term W_r z and τ; scores are a softmax (or divided by their
  sum), the gates a softmax over the selected scores. Each expert is a SwiGLU with its own
  AdaLN on c (stage awareness, paper §3.4).
* Loss (paper Eq 15): ‖ε − ε̂‖² + w_p Σ_layers ‖P̃P̃ᵀ − I‖²_F + w_a Σ_layers K Σ_i f_i p̄_i.

Variants: ``dit_dense`` (one SwiGLU with its AdaLN, no router, no prompt), ``no_domain_prompt``
(a learned constant in place of DP), ``no_stage_adaln`` (experts with a plain LayerNorm).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import NshotError
from nshot.train.checkpoint import LoadedCheckpoint

from .config import TimeModeConfig


def sincos_positions(length: int, d: int) -> torch.Tensor:
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(length, d)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d // 2])
    return pe


def timestep_embedding(t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    half = dim // 2
    steps = torch.arange(half, dtype=torch.float32, device=t.device)
    freqs = torch.exp(-math.log(10000.0) * steps / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


def _zero(linear: nn.Linear) -> nn.Linear:
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    return linear


class Expert(nn.Module):
    """E(z, c) = W_down(SiLU(W_gate u) ⊙ W_up u) + z, u = LN(z)(1 + sc) + sh (own AdaLN on c)."""

    def __init__(self, d: int, n: int, stage_adaln: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d, elementwise_affine=not stage_adaln, eps=1e-6)
        self.ada = _zero(nn.Linear(d, 2 * d)) if stage_adaln else None
        self.gate = nn.Linear(d, n * d)
        self.up = nn.Linear(d, n * d)
        self.down = nn.Linear(n * d, d)

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        u = self.norm(z)
        if self.ada is not None:
            sh, sc = self.ada(F.silu(c)).chunk(2, dim=-1)
            if u.dim() == 3:
                u = modulate(u, sh, sc)
            else:  # tokens gathered from several samples (sparse dispatch): c per token
                u = u * (1 + sc) + sh
        return self.down(F.silu(self.gate(u)) * self.up(u)) + z


@dataclass
class Routing:
    """One MoDE layer's routing: scores s (B, L, K), gates G (B, L, K; zero off the top-k)."""

    scores: torch.Tensor
    gates: torch.Tensor


class MoDE(nn.Module):
    """Mixture of Domain Experts with a shared expert (paper §3.3)."""

    def __init__(self, cfg: TimeModeConfig) -> None:
        super().__init__()
        d, stage = cfg.d_model, cfg.system != "no_stage_adaln"
        self.routed = cfg.routed
        self.shared = Expert(d, cfg.expansion, stage)
        if self.routed:
            self.k, self.top_k, self.tau, self.mode = cfg.experts, cfg.top_k, cfg.tau, cfg.routing
            self.experts = nn.ModuleList(
                Expert(d, cfg.expansion, stage) for _ in range(cfg.experts)
            )
            self.prototypes = nn.Parameter(torch.randn(cfg.experts, cfg.basis, d) / math.sqrt(d))
            self.router = nn.Linear(d, cfg.experts, bias=False)

    def normalised_prototypes(self) -> torch.Tensor:
        return F.normalize(self.prototypes, dim=-1)

    def route(self, z: torch.Tensor, dp: torch.Tensor) -> Routing:
        p = self.normalised_prototypes()  # (K, h_b, d)
        match = torch.einsum("khd,bd->bkh", p, dp).pow(2).sum(-1)  # (B, K)
        logits = match[:, None, :] + self.router(z) + self.tau
        if self.mode == "softmax":
            s = logits.softmax(-1)
        else:
            s = logits / logits.sum(-1, keepdim=True)
        top, idx = s.topk(self.top_k, dim=-1)
        g = torch.zeros_like(s).scatter(-1, idx, top.softmax(-1))
        return Routing(s, g)

    def forward(
        self, z: torch.Tensor, c: torch.Tensor, dp: torch.Tensor | None, dispatch: str = "dense"
    ) -> tuple[torch.Tensor, Routing | None]:
        out = self.shared(z, c)
        if not self.routed:
            return out, None
        r = self.route(z, dp)
        if dispatch == "dense":
            ys = torch.stack([e(z, c) for e in self.experts], dim=2)  # (B, L, K, d)
            return out + (r.gates[..., None] * ys).sum(2), r
        b, length, d = z.shape
        flat = z.reshape(-1, d)
        cflat = c[:, None, :].expand(b, length, c.shape[-1]).reshape(-1, c.shape[-1])
        gflat = r.gates.reshape(-1, self.k)
        mixed = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            rows = torch.nonzero(gflat[:, i] > 0, as_tuple=True)[0]
            if len(rows) == 0:
                continue
            y = expert(flat[rows], cflat[rows])
            mixed = mixed.index_add(0, rows, gflat[rows, i, None] * y)
        return out + mixed.reshape(b, length, d), r

    def orthogonality(self) -> torch.Tensor:
        p = self.normalised_prototypes().reshape(-1, self.prototypes.shape[-1])
        eye = torch.eye(p.shape[0], dtype=p.dtype, device=p.device)
        return (p @ p.T - eye).pow(2).sum()

    @staticmethod
    def balance(r: Routing, k: int) -> torch.Tensor:
        """K Σ_i f_i p̄_i; f_i (top-k membership fraction) carries no gradient."""
        f = (r.gates > 0).float().mean(dim=(0, 1)).detach()
        p = r.scores.mean(dim=(0, 1))
        return k * (f * p).sum()


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        q, k, v = self.qkv(x).reshape(b, length, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(y.transpose(1, 2).reshape(b, length, d))


class Block(nn.Module):
    """h += g1 ⊙ MHSA(adaLN(h)); h += g2 ⊙ MoDE(adaLN(h); DP, c) (adaLN-Zero)."""

    def __init__(self, cfg: TimeModeConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(d, cfg.heads)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mlp = MoDE(cfg)
        self.ada = _zero(nn.Linear(d, 6 * d))

    def forward(
        self, h: torch.Tensor, c: torch.Tensor, dp: torch.Tensor | None, dispatch: str
    ) -> tuple[torch.Tensor, Routing | None]:
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(F.silu(c)).chunk(6, dim=-1)
        h = h + g1[:, None] * self.attn(modulate(self.norm1(h), sh1, sc1))
        y, r = self.mlp(modulate(self.norm2(h), sh2, sc2), c, dp, dispatch)
        return h + g2[:, None] * y, r


class PromptEncoder(nn.Module):
    """DP = mean_L(Linear(d→d)(Conv1d(C→d, k=3)(x_ex)) + PE)."""

    def __init__(self, cfg: TimeModeConfig, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, cfg.d_model, 3, padding=1)
        self.lin = nn.Linear(cfg.d_model, cfg.d_model)
        self.register_buffer("pe", sincos_positions(cfg.window, cfg.d_model), persistent=False)

    def forward(self, ex: torch.Tensor) -> torch.Tensor:
        y = self.lin(self.conv(ex.transpose(1, 2)).transpose(1, 2)) + self.pe
        return y.mean(1)


@dataclass
class Output:
    eps: torch.Tensor  # the denoiser's output: ε̂, or x̂0 where the diffusion predicts x0
    routings: list[Routing]


class Denoiser(nn.Module):
    """ε_θ(x_t, t, x_ex) for windows (B, L, C)."""

    def __init__(self, cfg: TimeModeConfig, channels: int = 1) -> None:
        super().__init__()
        d = cfg.d_model
        self.system = cfg.system
        self.dispatch = cfg.dispatch
        self.embed = nn.Linear(channels, d)
        self.register_buffer("pe", sincos_positions(cfg.window, d), persistent=False)
        self.t_mlp = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        if cfg.system in ("timemode", "no_stage_adaln"):
            self.prompt = PromptEncoder(cfg, channels)
        elif cfg.system == "no_domain_prompt":
            self.prompt_const = nn.Parameter(torch.randn(d) / math.sqrt(d))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.final_ada = _zero(nn.Linear(d, 2 * d))
        self.out = _zero(nn.Linear(d, channels))

    @property
    def uses_prompt(self) -> bool:
        return hasattr(self, "prompt")

    def domain_prompt(self, ex: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        if hasattr(self, "prompt"):
            if ex is None:
                raise ValueError("this model needs a clean exemplar per sample")
            return self.prompt(ex)
        if hasattr(self, "prompt_const"):
            return self.prompt_const[None].expand(batch, -1)
        return None

    def forward(self, x: torch.Tensor, t: torch.Tensor, ex: torch.Tensor | None = None) -> Output:
        dispatch = self.dispatch
        if dispatch == "auto":
            dispatch = "sparse" if x.is_cuda else "dense"
        c = self.t_mlp(timestep_embedding(t))
        dp = self.domain_prompt(ex, x.shape[0])
        h = self.embed(x) + self.pe
        routings = []
        for block in self.blocks:
            h, r = block(h, c, dp, dispatch)
            if r is not None:
                routings.append(r)
        sh, sc = self.final_ada(F.silu(c)).chunk(2, dim=-1)
        return Output(self.out(modulate(self.norm(h), sh, sc)), routings)

    def regularisers(self, routings: list[Routing]) -> tuple[torch.Tensor, torch.Tensor]:
        """(Σ_layers ‖P̃P̃ᵀ − I‖², Σ_layers K Σ f_i p̄_i); zeros without a router."""
        zero = torch.zeros(())
        if not routings:
            return zero, zero
        ortho = sum((b.mlp.orthogonality() for b in self.blocks), zero)
        bal = sum((MoDE.balance(r, b.mlp.k) for b, r in zip(self.blocks, routings)), zero)
        return ortho, bal


SAMPLERS = ("ddpm", "ddpm_posterior", "ddim")


class Diffusion:
    """DDPM (ε-prediction by default) with the fixed reverse variance σ_t² = β_t (Ho et al. 2020; exact
    for N(0, I) data, see the unit check); linear β schedule rescaled to T.

    ``sampler`` picks the reverse chain (the model is trained the same way for all three):
    ``"ddpm"`` (default) the ancestral chain with σ_t² = β_t; ``"ddpm_posterior"`` the same with
    the posterior variance σ_t² = β̃_t = β_t (1 − ᾱ_{t−1}) / (1 − ᾱ_t) (Ho et al. 2020 §3.2, the
    smaller choice); ``"ddim"`` the deterministic DDIM chain (Song et al. 2021, η = 0) over all T
    steps, from the same clipped x̂0. The alternatives exist for the diagnosis of rough samples
    (:func:`~.experiments.roughness_report`).

    ``prediction`` is what the denoiser outputs and is trained on: ``"eps"`` (default) the
    noise, ``"x0"`` the clean window (the parametrisation of Diffusion-TS); every chain reads
    x̂0 through :meth:`predict_x0`, so both parametrisations share them."""

    def __init__(self, steps: int, sampler: str = "ddpm", prediction: str = "eps") -> None:
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler: {sampler!r} is not one of {SAMPLERS}")
        if prediction not in ("eps", "x0"):
            raise ValueError(f"prediction: {prediction!r} is not eps or x0")
        self.sampler, self.prediction = sampler, prediction
        self.T = steps
        scale = 1000.0 / steps
        b = torch.linspace(1e-4 * scale, 2e-2 * scale, steps, dtype=torch.float64).clamp(max=0.999)
        a = 1.0 - b
        abar = torch.cumprod(a, 0)
        prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
        self.betas, self.alphas, self.abar, self.abar_prev = b, a, abar, prev
        self.coef_x0 = b * prev.sqrt() / (1 - abar)
        self.coef_xt = (1 - prev) * a.sqrt() / (1 - abar)
        self.post_var = b * (1 - prev) / (1 - abar)  # β̃_t, the ddpm_posterior chain's σ_t²

    def _at(self, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return v.to(t.device)[t].float()[:, None, None]

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        return self._at(self.abar, t).sqrt() * x0 + (1 - self._at(self.abar, t)).sqrt() * eps

    def posterior_mean(self, x0: torch.Tensor, xt: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self._at(self.coef_x0, t) * x0 + self._at(self.coef_xt, t) * xt

    def predict_x0(self, xt: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x̂0 (clipped to [−3, 3]) from the denoiser's output: ε̂ or, with ``prediction="x0"``,
        x̂0 itself."""
        if self.prediction == "x0":
            return out.clamp(-3.0, 3.0)
        ab = self._at(self.abar, t)
        return ((xt - (1 - ab).sqrt() * out) / ab.sqrt()).clamp(-3.0, 3.0)

    def target(self, x0: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """What the denoiser is trained to output (MSE): the noise, or the clean window."""
        return x0 if self.prediction == "x0" else eps

    def reverse_mean(self, xt: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The mean of p(x_{t−1} | x_t): the posterior mean at x̂0 (clipped to [−3, 3])."""
        return self.posterior_mean(self.predict_x0(xt, t, out), xt, t)

    @torch.no_grad()
    def sample(self, eps_fn, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        """Ancestral sampling over all T steps; ``eps_fn(x_t, t) → ε̂``."""
        return self.sample_groups(eps_fn, [shape[0]], shape[1:], [gen])

    @torch.no_grad()
    def sample_groups(
        self, eps_fn, sizes: list[int], tail: tuple[int, ...], gens: list[torch.Generator]
    ) -> torch.Tensor:
        """One reverse chain over stacked groups of samples: group i has ``sizes[i]`` rows and
        draws its initial and per-step noise from ``gens[i]``, in the order one chain of that
        group alone draws them, so a group's samples do not depend on the others (up to the
        rounding of the batched ε̂)."""

        def draw() -> torch.Tensor:
            return torch.cat([torch.randn((n, *tail), generator=g)
                              for n, g in zip(sizes, gens, strict=True)])  # fmt: skip

        x = draw()
        for step in reversed(range(self.T)):
            t = torch.full((len(x),), step, dtype=torch.long)
            eps = eps_fn(x, t)
            if self.sampler == "ddim":  # x_{t-1} = √ᾱ_{t-1} x̂0 + √(1 − ᾱ_{t-1}) ε̂(x̂0)
                x0 = self.predict_x0(x, t, eps)
                e = (x - self._at(self.abar, t).sqrt() * x0) / (1 - self._at(self.abar, t)).sqrt()
                ap = self._at(self.abar_prev, t)
                x = ap.sqrt() * x0 + (1 - ap).sqrt() * e
                continue
            mean = self.reverse_mean(x, t, eps)
            if step == 0:
                x = mean
            elif self.sampler == "ddpm":
                x = mean + self._at(self.betas, t).sqrt() * draw()
            else:
                x = mean + self._at(self.post_var, t).sqrt() * draw()
        return x


class TimeModeState(nn.Module):
    """What a checkpoint holds: the denoiser, its EMA, and per domain the clean exemplar bank
    (scaled, ``bank_count`` rows valid) and the min-max scaler (``lo``, ``hi``)."""

    def __init__(self, cfg: TimeModeConfig, domains: int, channels: int = 1) -> None:
        super().__init__()
        self.net = Denoiser(cfg, channels)
        self.ema = copy.deepcopy(self.net)
        for p in self.ema.parameters():
            p.requires_grad_(False)
        shape = (domains, cfg.bank_size, cfg.window, channels)
        self.register_buffer("bank", torch.zeros(shape))
        self.register_buffer("bank_count", torch.zeros(domains, dtype=torch.long))
        self.register_buffer("lo", torch.zeros(domains, channels, dtype=torch.float64))
        self.register_buffer("hi", torch.ones(domains, channels, dtype=torch.float64))

    @torch.no_grad()
    def update_ema(self, decay: float) -> None:
        for e, p in zip(self.ema.parameters(), self.net.parameters(), strict=True):
            e.mul_(decay).add_(p.detach(), alpha=1 - decay)

    @torch.no_grad()
    def set_bank(self, i: int, windows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        n = min(len(windows), self.bank.shape[1])
        self.bank[i].zero_()
        self.bank[i, :n] = torch.from_numpy(np.ascontiguousarray(windows[:n]))
        self.bank_count[i] = n
        self.lo[i] = torch.from_numpy(np.asarray(lo, np.float64))
        self.hi[i] = torch.from_numpy(np.asarray(hi, np.float64))


@torch.no_grad()
def generate(
    net: Denoiser, diffusion: Diffusion, exemplars: torch.Tensor, n: int, seed: int,
    chunk: int = 1024,
) -> torch.Tensor:  # fmt: skip
    """``n`` windows (scaled units), each conditioned on one exemplar drawn at random from
    ``exemplars`` (k, L, C) (paper §3: one random target exemplar per generated window)."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(exemplars), (n,), generator=gen)
    out = []
    for start in range(0, n, chunk):
        ex = exemplars[idx[start : start + chunk]]
        m = len(ex)
        out.append(diffusion.sample(lambda x, t, e=ex: net(x, t, e).eps, (m, *ex.shape[1:]), gen))
    return torch.cat(out)


@torch.no_grad()
def generate_many(
    net: Denoiser, diffusion: Diffusion, sets: list[tuple[torch.Tensor, int, int]]
) -> list[torch.Tensor]:
    """:func:`generate` for several (exemplars, n, seed) sets (each n ≤ its ``chunk``) in one
    reverse chain over their stacked samples: set i's answer equals ``generate(net, diffusion,
    *sets[i])`` up to the rounding of the batched forward pass (each set keeps its own
    generator, drawn in the same order)."""
    gens, exs = [], []
    for exemplars, n, seed in sets:
        gen = torch.Generator().manual_seed(seed)
        exs.append(exemplars[torch.randint(len(exemplars), (n,), generator=gen)])
        gens.append(gen)
    ex = torch.cat(exs)
    sizes = [len(e) for e in exs]
    x = diffusion.sample_groups(lambda x, t: net(x, t, ex).eps, sizes, tuple(ex.shape[1:]), gens)
    return list(x.split(sizes))


def build_state(cfg: TimeModeConfig, domains: int) -> TimeModeState:
    return TimeModeState(cfg, domains)


def load_model(checkpoint: LoadedCheckpoint) -> tuple[TimeModeState, TimeModeConfig, dict]:
    """The state of a timemode checkpoint (eval mode), its config and its run record."""
    cfg = TimeModeConfig.validated(checkpoint.config)
    run = checkpoint.extra.get("run")
    names = run.get("domains") if isinstance(run, dict) else None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise NshotError(f"{checkpoint.path}: not a timemode checkpoint (no domain record)")
    if len(names) > 64:
        raise NshotError(f"{checkpoint.path}: {len(names)} domains is more than 64")
    state = build_state(cfg, len(names))
    try:
        state.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the config: {err}") from None
    return state.eval(), cfg, run
