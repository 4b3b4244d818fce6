"""The URS network: UDR embedding, ICAM-style AAFM encoder with the mixed bias module (MBM),
the problem-conditioned parameter generator, and the masked POMO decoder.

Reconstruction choices (the paper leaves them open):

- the global UDR vector is embedded and added to every node embedding;
- MBM: each encoder layer mixes the five bias matrices with weights ``w = w_base + Δw(desc)``
  (``w_base`` init ``[1, .5, .5, .5, .1]``; B_2..B_5 are expressed in distance units and scaled
  by −log2 N like B_1, so a unit weight is comparable across terms); without MBM only B_1
  (whose weight is the per-layer α of ICAM);
- generator: the descriptor (global UDR vector + pooled node statistics) feeds a 2-layer MLP
  whose zero-initialised output gives Δw for every layer and the left factors U of rank-r
  deltas ``ΔW = U(desc) Vᵀ`` of the decoder's Wq', Wk, Wv; the right factors V are ordinary
  learned parameters (with both factors generated from a zero output, ΔW = U Vᵀ would get no
  gradient at all);
- the AAFM runs in float32 with the row maximum of the bias and the column maximum of k
  subtracted (they cancel between numerator and denominator), so it does not overflow at
  N = 1000.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import NshotError
from nshot.train.checkpoint import LoadedCheckpoint

from .config import URSConfig
from .env import Env
from .layers import STATE_DIM, InstanceNorm, RoutingNet
from .mtpomo import MTPOMONet
from .representation import GLOBAL_DIM, NODE_DIM, Instances, flag_features, udr_features

DESC_DIM = 12
K_BIAS = 5
W_INIT = (1.0, 0.5, 0.5, 0.5, 0.1)


def descriptor(inst: Instances) -> np.ndarray:
    """Generator input [B, 12]: global UDR + pooled node statistics (aug-invariant)."""
    node, glob = udr_features(inst)
    M = inst.num_depots
    c = node[:, M:]
    back_frac = (c[..., 3] > 0).mean(-1)
    return np.concatenate(
        [
            glob,
            np.stack(
                [
                    c[..., 2].mean(-1) * 10,
                    c[..., 2].std(-1) * 10,
                    back_frac,
                    (c[..., 5] - c[..., 4]).mean(-1),
                    c[..., 6].mean(-1) * 10,
                    np.full(len(inst), math.log(max(inst.num_customers, 2)) / math.log(1000)),
                    np.full(len(inst), (M - 1) / 4.0),
                ],
                -1,
            ),
        ],
        -1,
    ).astype(np.float32)


def mbm_biases(inst: Instances, dist: torch.Tensor, k: int) -> torch.Tensor:
    """The bias matrices [B, k, V, V] (float32): geometric, TW reachability, waiting,
    backhaul precedence, return cost."""
    n = max(inst.num_customers, 2)
    s = math.log2(n)
    d = dist.float()
    out = [-s * d]
    if k > 1:
        f32 = dict(dtype=torch.float32, device=dist.device)
        e = torch.as_tensor(inst.tw[..., 0], **f32)
        lt = torch.as_tensor(np.minimum(inst.tw[..., 1], 1e6), **f32)
        sv = torch.as_tensor(inst.service, **f32)
        lin = torch.as_tensor(inst.linehaul, **f32) > 0
        back = torch.as_tensor(inst.backhaul, **f32) > 0
        classic = torch.as_tensor(inst.backhaul_class == 1, device=dist.device)[:, None, None]
        closed = torch.as_tensor(~inst.open_route.astype(bool), **f32)[:, None, None]
        M = inst.num_depots
        d_near = d[:, :, :M].min(-1).values
        ready = (e + sv)[:, :, None] + d  # earliest departure from i, arriving at j
        out.append(-s * F.relu(ready - lt[:, None, :]))
        out.append(-s * F.relu(e[:, None, :] - (lt + sv)[:, :, None] - d))
        out.append(-s * (back[:, :, None] & lin[:, None, :] & classic).float())
        out.append((-s * closed * d_near[:, None, :]).expand_as(d))
    return torch.stack(out, 1)


def kv_factors(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[exp(k − max_nodes k) ⊙ v, exp(k − max_nodes k)]: the AAFM's key/value side."""
    ek = torch.exp(k - k.amax(dim=2, keepdim=True))
    return torch.cat([ek * v, ek], -1)


def aafm(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    kv: torch.Tensor | None = None,
) -> torch.Tensor:
    """σ(q) ⊙ [exp(bias) @ (exp(k) ⊙ v)] / [exp(bias) @ exp(k)], numerically stable.

    q [B, A, Lq, d]; k, v [B, A, V, d]; bias [B, V, V] (shared over A, encoder) or
    [B, A, Lq, V] (decoder; may hold −inf).
    """
    B, A, V, D = k.shape
    x = kv_factors(k, v) if kv is None else kv  # [B, A, V, 2d]
    eb = torch.exp(bias - bias.amax(dim=-1, keepdim=True))
    if bias.dim() == 3:
        xs = x.permute(0, 2, 1, 3).reshape(B, V, A * 2 * D)
        y = torch.bmm(eb, xs).reshape(B, V, A, 2 * D).permute(0, 2, 1, 3)
    else:
        y = torch.matmul(eb, x)
    num, den = y[..., :D], y[..., D:]
    return torch.sigmoid(q) * num / den.clamp_min(1e-30)


class EncoderLayer(nn.Module):
    def __init__(self, d: int, ff: int) -> None:
        super().__init__()
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d)
        self.n1 = InstanceNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.ReLU(), nn.Linear(ff, d))
        self.n2 = InstanceNorm(d)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.n1(x + self.wo(aafm(self.wq(x), self.wk(x), self.wv(x), bias)))
        return self.n2(h + self.ff(h))


@dataclass
class Encoded:
    h: torch.Tensor  # [B, A, V, d]
    k: torch.Tensor
    v: torch.Tensor
    e: torch.Tensor  # single-head keys
    kv: torch.Tensor  # precomputed AAFM factors of k, v
    uq: torch.Tensor | None  # [B, in_q, r]
    log2n: float


class URSNet(RoutingNet):
    def __init__(
        self,
        d: int = 64,
        layers: int = 3,
        ff: int = 256,
        clip: float = 50.0,
        mbm: bool = True,
        generator: bool = True,
        gen_rank: int = 4,
        gen_hidden: int = 64,
        encoding: str = "udr",
    ) -> None:
        super().__init__()
        self.d, self.clip, self.encoding = d, clip, encoding
        self.k_bias = K_BIAS if mbm else 1
        self.node_embed = nn.Linear(NODE_DIM, d)
        self.global_embed = nn.Linear(GLOBAL_DIM, d)
        self.layers = nn.ModuleList(EncoderLayer(d, ff) for _ in range(layers))
        self.w_base = nn.Parameter(torch.tensor([W_INIT[: self.k_bias]] * layers))
        in_q = d + STATE_DIM
        self.in_q = in_q
        self.wq = nn.Linear(in_q, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d)
        self.alpha1 = nn.Parameter(torch.tensor(1.0))
        self.alpha2 = nn.Parameter(torch.tensor(1.0))
        self.rank = gen_rank
        self.generator: nn.Module | None = None
        if generator:
            out = layers * self.k_bias + gen_rank * (in_q + 2 * d)
            last = nn.Linear(gen_hidden, out)
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)
            self.generator = nn.Sequential(
                nn.Linear(DESC_DIM, gen_hidden), nn.ReLU(), nn.Linear(gen_hidden, gen_hidden),
                nn.ReLU(), last,
            )  # fmt: skip
            self.vq = nn.Parameter(torch.randn(d, gen_rank) / math.sqrt(d))
            self.vk = nn.Parameter(torch.randn(d, gen_rank) / math.sqrt(d))
            self.vv = nn.Parameter(torch.randn(d, gen_rank) / math.sqrt(d))

    # ------------------------------------------------------------------ encoder
    def encode(self, inst: Instances, dist: torch.Tensor, aug: int = 1) -> Encoded:
        dev = dist.device
        B = len(inst)
        node = np.stack([udr_features(inst.augment(a))[0] for a in range(aug)], 1)  # [B,A,V,8]
        glob = udr_features(inst)[1] if self.encoding == "udr" else flag_features(inst)
        x = self.node_embed(torch.as_tensor(node, device=dev))
        x = x + self.global_embed(torch.as_tensor(glob, device=dev))[:, None, None, :]
        L = len(self.layers)
        dw = uq = uk = uv = None
        if self.generator is not None:
            g = self.generator(torch.as_tensor(descriptor(inst), device=dev))
            n_w = L * self.k_bias
            dw = g[:, :n_w].reshape(B, L, self.k_bias)
            r, d = self.rank, self.d
            uq = g[:, n_w : n_w + r * self.in_q].reshape(B, self.in_q, r)
            rest = g[:, n_w + r * self.in_q :]
            uk = rest[:, : r * d].reshape(B, d, r)
            uv = rest[:, r * d :].reshape(B, d, r)
        biases = mbm_biases(inst, dist, self.k_bias)  # [B, K, V, V]
        for i, layer in enumerate(self.layers):
            w = self.w_base[i][None].expand(B, -1)
            if dw is not None:
                w = w + dw[:, i]
            bias = (w[:, :, None, None] * biases).sum(1)
            x = layer(x, bias)
        k = self.wk(x)
        v = self.wv(x)
        if uk is not None:
            k = k + torch.einsum("bavd,bdr,er->bave", x, uk, self.vk)
            v = v + torch.einsum("bavd,bdr,er->bave", x, uv, self.vv)
        n = max(inst.num_customers, 2)
        return Encoded(
            h=x, k=k, v=v, e=x.transpose(-1, -2), kv=kv_factors(k, v), uq=uq, log2n=math.log2(n)
        )

    # ------------------------------------------------------------------ decoder
    def logits(self, enc: Encoded, env: Env, mask: torch.Tensor) -> torch.Tensor:
        """Masked logits [B, R, V] for the current state (R = A × P rollouts)."""
        B, A, V, D = enc.h.shape
        P = env.R // A
        cur = env.cur.reshape(B, A, P)
        h_cur = torch.gather(enc.h, 2, cur[..., None].expand(-1, -1, -1, D))
        inp = torch.cat([h_cur, env.state_features().reshape(B, A, P, -1)], -1)
        q = self.wq(inp)
        if enc.uq is not None:
            q = q + torch.einsum("bapi,bir,er->bape", inp, enc.uq, self.vq)
        dcur = env.cur_dist().float().reshape(B, A, P, V)
        m = mask.reshape(B, A, P, V)
        neg = torch.zeros_like(dcur).masked_fill(~m, float("-inf"))
        g = aafm(q, enc.k, enc.v, -self.alpha1 * enc.log2n * dcur + neg, kv=enc.kv)
        g = self.wo(g)
        score = torch.matmul(g, enc.e) / math.sqrt(D)
        logit = self.clip * torch.tanh(score - self.alpha2 * enc.log2n * dcur)
        logit = logit.masked_fill(~m, float("-inf"))  # after the tanh clipping
        return logit.reshape(B, A * P, V)


def start_nodes(env: Env, starts: int) -> torch.Tensor:
    """POMO first customers [B, P]: distinct feasible customers, cycled if there are fewer."""
    m = env.mask()[:, 0, :].clone()  # every rollout starts in the same state
    m[:, : env.M] = False
    order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True)
    count = m.sum(-1).clamp_min(1)
    p = torch.arange(starts, device=m.device)[None, :] % count[:, None]
    return torch.gather(order, 1, p)


def rollout(
    model: RoutingNet,
    inst: Instances,
    starts: int,
    aug: int = 1,
    mode: str = "greedy",
    generator: torch.Generator | None = None,
) -> tuple[Env, torch.Tensor]:
    """Decode ``inst`` with ``starts`` POMO rollouts × ``aug`` augmentations.

    ``mode``: ``greedy``, ``sample`` (training), or ``random`` (uniform over feasible actions,
    the random-policy baseline). Returns the finished env (costs, routes) and Σ log p [B, R].
    """
    P = max(1, min(starts, inst.num_customers))
    dev = next(model.parameters()).device if model is not None else torch.device("cpu")
    env = Env(inst, P * aug, device=dev)
    first = start_nodes(env, P).repeat(1, aug)  # [B, A*P], augmentation-major
    enc = model.encode(inst, env.dist, aug) if mode != "random" else None
    logp = torch.zeros(env.B, env.R, device=dev)
    env.mask()
    env.step(first)
    limit = 2 * env.V + 2
    for _ in range(limit):
        if bool(env.done.all()):
            break
        mask = env.mask()
        if bool(env.done.all()):
            break
        if mode == "random":
            logit = torch.zeros(mask.shape, device=dev).masked_fill(~mask, float("-inf"))
        else:
            logit = model.logits(enc, env, mask)
        lp = torch.log_softmax(logit, -1)
        if mode == "greedy":
            act = lp.argmax(-1)
        else:
            probs = lp.exp().reshape(-1, env.V)
            act = torch.multinomial(probs, 1, generator=generator).reshape(env.B, env.R)
            ok = torch.gather(mask, 2, act[..., None])[..., 0]
            act = torch.where(ok, act, lp.argmax(-1))  # round-off guard
        if mode == "sample":
            logp = logp + torch.gather(lp, 2, act[..., None])[..., 0]
        env.step(act)
    return env, logp


@torch.no_grad()
def solve(
    model: RoutingNet | None,
    inst: Instances,
    starts: int,
    aug: int = 8,
    mode: str = "greedy",
    seed: int = 0,
) -> list[dict]:
    """Best rollout per instance: ``{"routes", "depots", "cost", "stuck"}`` (env's own view;
    feasibility is judged by :mod:`checker`)."""
    dev = next(model.parameters()).device if model is not None else torch.device("cpu")
    gen = torch.Generator(device=dev).manual_seed(seed)
    env, _ = rollout(model, inst, starts, aug, mode=mode, generator=gen)  # type: ignore[arg-type]
    cost = env.cost.masked_fill(env.stuck, float("inf"))
    best = cost.argmin(-1)
    out = []
    for b in range(env.B):
        r = int(best[b])
        routes, deps = env.solution(b, r)
        out.append(
            {"routes": routes, "depots": deps, "cost": float(env.cost[b, r]),
             "stuck": bool(env.stuck[b, r])}
        )  # fmt: skip
    return out


def build_model(cfg: URSConfig) -> RoutingNet:
    """The config's network: URS (``arch="urs"``) or the MTPOMO baseline (``arch="mtpomo"``:
    ``d``, ``layers``, ``ff``, ``heads`` and ``clip`` apply)."""
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    if cfg.arch == "mtpomo":
        return MTPOMONet(d=cfg.d, layers=cfg.layers, ff=cfg.ff, heads=cfg.heads, clip=cfg.clip)
    return URSNet(
        d=cfg.d,
        layers=cfg.layers,
        ff=cfg.ff,
        clip=cfg.clip,
        mbm=cfg.mbm,
        generator=cfg.generator,
        gen_rank=cfg.gen_rank,
        gen_hidden=cfg.gen_hidden,
        encoding=cfg.encoding,
    )


def load_model(checkpoint: LoadedCheckpoint) -> tuple[RoutingNet, URSConfig]:
    """The network (URS or MTPOMO) of a urs checkpoint (in eval mode) and the config it was trained with."""
    if checkpoint.method != "urs":
        raise NshotError(f"{checkpoint.path}: a {checkpoint.method!r} checkpoint, not urs")
    cfg = URSConfig.validated(checkpoint.config)
    net = build_model(cfg)
    net.load_state_dict(checkpoint.weights())
    net.eval()
    return net, cfg
