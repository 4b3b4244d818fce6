"""CFR's trained parts, its memory banks and its scoring (paper §3).

* Crossmodal mappings (§3.2): two GeGLU MLPs, G(x) = W3(GELU(a) ⊙ b) with [a; b] = W12 x, hidden
  width (C2 + C3) / 2: f23 maps RGB features to 3-D ones, f32 the reverse.
* Memory banks (§3.3): the RGB bank (valid F2 rows of the k shots, reduced by PatchCore's greedy
  coreset after a random projection) and the key-value bank (keys F3, values the F2 rows at the
  same pixels; the coreset is chosen on the keys). The PatchCore and BTF baselines use an F3
  bank and a joint [F2, F3] bank built the same way.
* Attention retriever (§3.3): for a 3-D query q, the top-k bank entries by cosine(q, key) are
  attended to with bias-free projections Wq, Wk, Wv (width ``d_model``) and Wout back to C2.
* Inference (§3.4): P2 = f32(F3), P3 = f23(F2); d_i = 1 − max_j cos(P2_i, RGBbank_j); where
  d_i ≥ θ the predicted P2_i is replaced by the retriever's r(F3_i) (or, without the retriever,
  by the RGB-bank row nearest to the *observed* F2_i); P3 is never replaced. The score is
  S = s2 ⊙ s3 with s = ‖P/‖P‖ − F/‖F‖‖, one box filter, zero on invalid pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import NshotError
from nshot.train.checkpoint import LoadedCheckpoint, save_checkpoint

from .config import VERSION, CfrConfig

BANKS = ("rgb_bank", "kv_keys", "kv_values", "xyz_bank", "joint_bank")
# how each system scores a test image
REPLACE = {
    "cfr": "retriever",
    "cfr_cyclic_only": "none",
    "cfr_nn_fallback": "nn",
    "cfm": "none",
    "cfr_random_replace": "random",
}


class GeGLU(nn.Module):
    def __init__(self, c_in: int, c_out: int, hidden: int) -> None:
        super().__init__()
        self.w12 = nn.Linear(c_in, 2 * hidden)
        self.w3 = nn.Linear(hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.gelu(a) * b)


class Retriever(nn.Module):
    """Attention over the top-k key-value bank entries of a 3-D query (bias-free)."""

    def __init__(self, c2: int, c3: int, d_model: int, top_k: int) -> None:
        super().__init__()
        self.wq = nn.Linear(c3, d_model, bias=False)
        self.wk = nn.Linear(c3, d_model, bias=False)
        self.wv = nn.Linear(c2, d_model, bias=False)
        self.wout = nn.Linear(d_model, c2, bias=False)
        self.d_model, self.top_k = d_model, top_k

    def forward(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        k = min(self.top_k, len(keys))
        sim = F.normalize(q, dim=-1) @ F.normalize(keys, dim=-1).T
        idx = sim.topk(k, dim=-1).indices  # q × k
        kp = self.wk(keys[idx])  # q × k × d
        vp = self.wv(values[idx])
        qp = self.wq(q)[:, None, :]  # q × 1 × d
        att = torch.softmax((qp * kp).sum(-1) / self.d_model**0.5, dim=-1)
        return self.wout((att[..., None] * vp).sum(1))


def cosd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1 − cos(a, b) averaged over rows."""
    return (1 - F.cosine_similarity(a, b, dim=-1)).mean()


def coreset_size(n: int, frac: float) -> int:
    """The number of rows the greedy coreset keeps: an int (the paper code's float crashes)."""
    return max(1, min(n, int(n * frac)))


def greedy_coreset(x: torch.Tensor, frac: float, proj: int, seed: int) -> torch.Tensor:
    """PatchCore's greedy (k-centre) coreset indices of the rows of ``x``, distances measured
    after a random Gaussian projection to ``proj`` dimensions."""
    n = len(x)
    m = coreset_size(n, frac)
    g = torch.Generator().manual_seed(seed)
    if proj < x.shape[1]:
        x = x @ (torch.randn(x.shape[1], proj, generator=g) / proj**0.5).to(x.device)
    first = int(torch.randint(n, (1,), generator=g))
    chosen = [first]
    dist = torch.cdist(x, x[first : first + 1]).squeeze(1)
    for _ in range(m - 1):
        nxt = int(dist.argmax())
        chosen.append(nxt)
        dist = torch.minimum(dist, torch.cdist(x, x[nxt : nxt + 1]).squeeze(1))
    return torch.tensor(chosen, dtype=torch.long, device=x.device)


@dataclass
class Scored:
    """One image's scores: the raw map S (H × W, zero where invalid) and what was replaced."""

    raw: torch.Tensor
    replaced: int
    valid: int
    #: the image score is max(S), not normalised (PatchCore's own definition)
    plain_max: bool = False

    @property
    def aupro_map(self) -> torch.Tensor:  # S / mean(S[S ≠ 0])
        nz = self.raw[self.raw != 0]
        return self.raw / nz.mean() if len(nz) else self.raw

    @property
    def image_score(self) -> float:  # max(S / sqrt(mean(S[S ≠ 0]))); PatchCore: max(S)
        if self.plain_max:
            return float(self.raw.max())
        nz = self.raw[self.raw != 0]
        return float((self.raw / nz.mean().sqrt()).max()) if len(nz) else 0.0

    @property
    def pixel_map(self) -> torch.Tensor:  # S / sqrt(mean(S)), zeros included
        m = self.raw.mean()
        return self.raw / m.sqrt() if m > 0 else self.raw


class CfrModel(nn.Module):
    """f23, f32, the retriever, the banks and the thresholds of one (class, k) run."""

    def __init__(self, cfg: CfrConfig, bank_sizes: dict[str, int] | None = None) -> None:
        super().__init__()
        c2, c3 = cfg.rgb_dim, cfg.xyz_dim
        hidden = (c2 + c3) // 2
        self.cfg = cfg
        self.f23 = GeGLU(c2, c3, hidden)
        self.f32 = GeGLU(c3, c2, hidden)
        self.retriever = Retriever(c2, c3, cfg.d_model, cfg.top_k)
        sizes = bank_sizes or {}
        widths = {"rgb_bank": c2, "kv_keys": c3, "kv_values": c2, "xyz_bank": c3,
                  "joint_bank": c2 + c3}  # fmt: skip
        for name in BANKS:
            self.register_buffer(name, torch.zeros(sizes.get(name, 0), widths[name]))
        # θ from the training images' d (quantile mode) and the serving threshold hint
        self.register_buffer("theta_q", torch.zeros(()))
        self.register_buffer("threshold_hint", torch.zeros(()))

    def bank_sizes(self) -> dict[str, int]:
        return {name: int(getattr(self, name).shape[0]) for name in BANKS}

    def mapping_parameters(self) -> list[nn.Parameter]:
        return [*self.f23.parameters(), *self.f32.parameters()]

    def mapping_loss(self, f2: torch.Tensor, f3: torch.Tensor, cycles: bool) -> torch.Tensor:
        """Stage 1 on the valid rows of one image: forward terms (+ the two cycle terms)."""
        p3, p2 = self.f23(f2), self.f32(f3)
        loss = cosd(p3, f3) + cosd(p2, f2)
        if cycles:
            loss = loss + cosd(self.f32(p3), f2) + cosd(self.f23(p2), f3)
        return loss

    @torch.no_grad()
    def set_banks(self, f2: torch.Tensor, f3: torch.Tensor, seed: int) -> None:
        """Stage 2: the coreset banks from the valid rows of the k shots."""
        cfg = self.cfg
        i2 = greedy_coreset(f2, cfg.coreset_frac, cfg.coreset_proj, seed)
        i3 = greedy_coreset(f3, cfg.coreset_frac, cfg.coreset_proj, seed + 1)
        joint = torch.cat([F.normalize(f2, dim=-1), F.normalize(f3, dim=-1)], -1)
        ij = greedy_coreset(joint, cfg.coreset_frac, cfg.coreset_proj, seed + 2)
        self.rgb_bank, self.kv_keys, self.kv_values = f2[i2], f3[i3], f2[i3]
        self.xyz_bank, self.joint_bank = f3[i3], joint[ij]

    def retrieve(self, q: torch.Tensor, subsample: int | None = None,
                 gen: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
        keys, values = self.kv_keys, self.kv_values
        if subsample is not None and subsample < len(keys):
            idx = torch.randperm(len(keys), generator=gen)[:subsample].to(keys.device)
            keys, values = keys[idx], values[idx]
        out = [self.retriever(c, keys, values) for c in q.split(self.cfg.query_chunk)]
        return torch.cat(out) if out else q.new_zeros(0, self.cfg.rgb_dim)

    def retrieval_loss(self, q: torch.Tensor, target: torch.Tensor, subsample: int,
                       gen: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
        """Stage 3: 1 − cos(r(F3), F2) over the queries."""
        return cosd(self.retrieve(q, subsample, gen), target)

    @torch.no_grad()
    def reliability(self, p2: torch.Tensor) -> torch.Tensor:
        """d_i = 1 − max_j cos(P2_i, RGBbank_j)."""
        bank = F.normalize(self.rgb_bank, dim=-1)
        best = torch.cat([(F.normalize(c, dim=-1) @ bank.T).max(-1).values
                          for c in p2.split(4096)])  # fmt: skip
        return 1 - best

    @torch.no_grad()
    def score(
        self,
        f2: torch.Tensor,
        f3: torch.Tensor,
        valid: torch.Tensor,
        system: str,
        theta: float | None = None,
        gen: torch.Generator | None = None,
    ) -> Scored:
        """Score one image (f2: H × W × C2, f3: H × W × C3, valid: H × W bool) on the
        model's device; the map comes back on the CPU."""
        dev = self.theta_q.device
        f2, f3, valid = f2.to(dev), f3.to(dev), valid.to(dev)
        h, w = valid.shape
        v = valid.reshape(-1)
        x2, x3 = f2.reshape(h * w, -1)[v], f3.reshape(h * w, -1)[v]
        replaced = 0
        if system in ("patchcore_rgb", "patchcore_3d", "btf"):
            if system == "btf":
                q = torch.cat([F.normalize(x2, dim=-1), F.normalize(x3, dim=-1)], -1)
                bank = self.joint_bank
            else:
                q, bank = (x2, self.rgb_bank) if system == "patchcore_rgb" else (x3, self.xyz_bank)
            s = torch.cat([torch.cdist(c, bank).min(-1).values for c in q.split(4096)])
        else:
            mode = REPLACE[system]
            p2, p3 = self.f32(x3), self.f23(x2)
            if mode != "none":
                t = float(self.theta_q) if theta is None else theta
                d = self.reliability(p2)
                sel = d >= t
                replaced = int(sel.sum())
                if mode == "random" and replaced:
                    perm = torch.randperm(len(sel), generator=gen)[:replaced].to(sel.device)
                    sel = torch.zeros_like(sel)
                    sel[perm] = True
                if replaced:
                    if mode == "retriever":
                        p2 = p2.clone()
                        p2[sel] = self.retrieve(x3[sel])
                    elif mode == "nn":
                        bank = F.normalize(self.rgb_bank, dim=-1)
                        nn_idx = (F.normalize(x2[sel], dim=-1) @ bank.T).argmax(-1)
                        p2 = p2.clone()
                        p2[sel] = self.rgb_bank[nn_idx]
                    else:  # random: the retriever's features at randomly chosen pixels
                        p2 = p2.clone()
                        p2[sel] = self.retrieve(x3[sel])
            s2 = (F.normalize(p2, dim=-1) - F.normalize(x2, dim=-1)).norm(dim=-1)
            s3 = (F.normalize(p3, dim=-1) - F.normalize(x3, dim=-1)).norm(dim=-1)
            s = s2 * s3
        full = torch.zeros(h * w, dtype=s.dtype, device=s.device)
        full[v] = s
        k = self.cfg.smooth
        sm = F.avg_pool2d(full.reshape(1, 1, h, w), k, stride=1, padding=k // 2,
                          count_include_pad=True).reshape(h, w)  # fmt: skip
        sm = torch.where(valid, sm, torch.zeros_like(sm))
        return Scored(
            raw=sm.cpu(),
            replaced=replaced,
            valid=int(v.sum()),
            plain_max=system in ("patchcore_rgb", "patchcore_3d"),
        )


def build_model(cfg: CfrConfig, bank_sizes: dict[str, int] | None = None) -> CfrModel:
    return CfrModel(cfg, bank_sizes)


def bank_sizes_of(run: Any, where: str) -> dict[str, int]:
    """The memory-bank sizes a run record declares, checked (a checkpoint's or a bundle
    entry's; ``where`` names it in the error)."""
    sizes = run.get("bank_sizes") if isinstance(run, dict) else None
    if not isinstance(sizes, dict) or set(sizes) != set(BANKS):
        raise NshotError(f"{where}: not a cfr checkpoint (no memory-bank record)")
    if any(not isinstance(n, int) or not 0 <= n <= 10_000_000 for n in sizes.values()):
        raise NshotError(f"{where}: memory-bank sizes out of range: {sizes}")
    return sizes


def load_model(checkpoint: LoadedCheckpoint) -> tuple[CfrModel, CfrConfig, dict]:
    """The model of a cfr checkpoint (eval mode), its config and its run record."""
    if "bundle" in checkpoint.extra:
        raise NshotError(
            f"{checkpoint.path}: a bundle of {len(checkpoint.extra['bundle'])} cfr models; "
            "read it with load_models"
        )
    cfg = CfrConfig.validated(checkpoint.config)
    run = checkpoint.extra.get("run")
    sizes = bank_sizes_of(run, str(checkpoint.path))
    model = build_model(cfg, sizes)
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the config: {err}") from None
    return model.eval(), cfg, run


# --- bundles: one checkpoint holding several (class, k) models, so that one deployment
# serves them all (`python -m nshot.methods.cfr.bundle`)

# what every model of a bundle shares: one set of frozen extractors and one image size
BUNDLE_SHARED = ("generator", "generator_version", "features", "grid", "rgb_dim", "xyz_dim", "feature_seed",
                 "dino_path", "pointmae_path", "pointmae_groups", "pointmae_group_size")  # fmt: skip
MAX_BUNDLE = 256


@dataclass
class Loaded:
    """One (class, k) model of a checkpoint or a bundle, with its config and run record."""

    model: CfrModel
    cfg: CfrConfig
    run: dict
    step: int

    @property
    def class_name(self) -> str:
        return class_of(self.cfg, self.run)

    @property
    def shot(self) -> int:
        return int(self.cfg.shot)

    @property
    def banks_built(self) -> bool:
        return bool(self.run.get("banks_built", False))


def class_of(cfg: CfrConfig, run: dict) -> str:
    """The object class of a run (its record's, else its config's)."""
    return str(run.get("class_name", cfg.class_name))


def bundle_entries(extra: dict[str, Any], where: str) -> list[tuple[CfrConfig, dict, int]]:
    """A bundle's entries, checked without reading a tensor: (config, run record, step) each,
    every config valid, banks built, one model per (class, k), the shared fields equal."""
    entries = extra.get("bundle")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_BUNDLE:
        raise NshotError(f"{where}: a bundle holds 1 to {MAX_BUNDLE} models")
    out: list[tuple[CfrConfig, dict, int]] = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) != {"config", "run", "step"}:
            raise NshotError(f"{where}: bundle entry {i} is not {{config, run, step}}")
        cfg = CfrConfig.validated(e["config"])
        bank_sizes_of(e["run"], f"{where}: bundle entry {i}")
        if not e["run"].get("banks_built") or not isinstance(e["step"], int):
            raise NshotError(f"{where}: bundle entry {i} has no memory banks")
        out.append((cfg, e["run"], e["step"]))
    check_bundle([(c, class_of(c, r), f"entry {i}") for i, (c, r, _) in enumerate(out)], where)
    return out


def check_bundle(models: list[tuple[CfrConfig, str, str]], where: str) -> None:
    """``models``: (config, class name, what to call it). One per (class, k); the shared
    fields (``BUNDLE_SHARED``) equal to the first's."""
    seen: dict[tuple[str, int], str] = {}
    first = models[0][0]
    for cfg, name, what in models:
        key = (name, cfg.shot)
        if key in seen:
            raise NshotError(
                f"{where}: {seen[key]} and {what} are both the model of class {name!r} at "
                f"k = {cfg.shot}; a bundle holds one model per (class, k)"
            )
        seen[key] = what
        for f in BUNDLE_SHARED:
            if getattr(cfg, f) != getattr(first, f):
                raise NshotError(
                    f"{where}: field '{f}' is {getattr(cfg, f)!r} in {what} but "
                    f"{getattr(first, f)!r} in {models[0][2]}; the models of a bundle share "
                    f"their extractors and image size ({', '.join(BUNDLE_SHARED)})"
                )


def load_models(checkpoint: LoadedCheckpoint) -> list[Loaded]:
    """Every model of a checkpoint: its one model, or a bundle's, in the bundle's order."""
    if "bundle" not in checkpoint.extra:
        model, cfg, run = load_model(checkpoint)
        return [Loaded(model, cfg, run, checkpoint.step)]
    where = str(checkpoint.path)
    entries = bundle_entries(checkpoint.extra, where)
    weights = checkpoint.weights()
    prefixes = [f"m{i}." for i in range(len(entries))]
    stray = sorted(k for k in weights if not k.startswith(tuple(prefixes)))
    if stray:
        raise NshotError(f"{where}: tensors of no bundle entry: {', '.join(stray[:3])}")
    out = []
    for (cfg, run, step), p in zip(entries, prefixes, strict=True):
        model = build_model(cfg, bank_sizes_of(run, where))
        state = {k[len(p) :]: v for k, v in weights.items() if k.startswith(p)}
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            raise NshotError(f"{where}: the weights of {p[:-1]} do not fit: {err}") from None
        out.append(Loaded(model.eval(), cfg, run, step))
    return out


def write_bundle(checkpoints: list[LoadedCheckpoint], out: str | Path) -> Path:
    """One checkpoint holding every model of ``checkpoints`` (single runs or bundles, each
    with its memory banks built): tensors ``m<i>.<name>``, each model's config, run record
    and step in ``extra["bundle"]``. ``out`` must not exist."""
    out = Path(out)
    if out.exists():
        raise NshotError(f"{out}: exists; a bundle is written to a new path")
    models: list[tuple[Loaded, str]] = []
    for ckpt in checkpoints:
        if ckpt.method != "cfr":
            raise NshotError(f"{ckpt.path}: a {ckpt.method} checkpoint, not a cfr one")
        for i, m in enumerate(load_models(ckpt)):
            if not m.banks_built:
                raise NshotError(
                    f"{ckpt.path}: saved at step {m.step}, during stage 1, before its memory "
                    "banks exist"
                )
            what = str(ckpt.path) if "bundle" not in ckpt.extra else f"{ckpt.path} (m{i})"
            models.append((m, what))
    if not 1 <= len(models) <= MAX_BUNDLE:
        raise NshotError(f"a bundle holds 1 to {MAX_BUNDLE} models, not {len(models)}")
    check_bundle([(m.cfg, m.class_name, what) for m, what in models], "bundle")
    state = {f"m{i}.{k}": v for i, (m, _) in enumerate(models)
             for k, v in m.model.state_dict().items()}  # fmt: skip
    entries = [{"config": m.cfg.model_dump(), "run": m.run, "step": m.step}
               for m, _ in models]  # fmt: skip
    return save_checkpoint(
        out, method="cfr", method_version=VERSION, config=entries[0]["config"],
        step=max(m.step for m, _ in models), model_state=state, extra={"bundle": entries},
    )  # fmt: skip
