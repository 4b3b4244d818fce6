"""GPU check of the ``paper`` presets of atha and dirclip, at the real architecture with random
weights, and of the CUDA paths of cfr and timemode. No Ray needed; nothing is downloaded.

    python examples/gpu_paper_check.py --out gpu_paper      # on one GPU: ViT-B sizes
    python examples/gpu_paper_check.py --tiny --out DIR      # toy sizes, CPU, seconds (CI)

No CLIP weights ship offline, so the paper runs here use a randomly initialised CLIP with the
real shapes (ViT-B/16 for atha, ViT-B/32 for dirclip: 224² images, 768-wide 12-block image
tower, 512-wide 12-block text tower, 512-d embedding, 77 tokens; the tokenizer is a small BPE,
so only the text embedding table is smaller than the real 49,408 rows) and image folders of
random PNGs whose mean colour differs by class (a tuned system can learn the colour; the
accuracies say nothing about the methods). What the run measures is:

1. atha: each system's seconds for one 5-way episode at the paper's values (100 epochs, LoRA
   r = 16 on both towers, 15 queries per class; 1-shot for every system, 5-shot for those of
   ``systems_5shot``), the preset's cost extrapolated from them (episodes × domains), and the
   unit checks on the device (ρ = 0 against CoOp + LoRA, the prompt route against the CLIP's
   text features, the anchors' reconstruction), and ATHA's episode again with TF32 matrix
   products (PyTorch's default is full fp32);
2. dirclip: seconds per training step of UCAT at the paper's batch (256, two PGD steps), the
   paper's evaluation (clean, PGD-100, APGD-CE) per image, and the preset's cost extrapolated
   (6 trained rows × 4,000 steps, validations, 7 evaluations), the share of a step spent
   reading the batch's PNG files, and the step with TF32 matrix products;
3. cfr: the ``smoke`` reproduction with its stages on ``cuda`` (``job_gpus=1``) against the
   same on the CPU (``job_gpus=0``), row by row;
4. timemode: the mixture-of-experts layer's sparse dispatch (used on ``cuda``) against the
   dense one (the CPU's) on the same weights and inputs;
5. train: ``nshot train``'s steps of bsr (masked pretraining), timemode and tgdt (``fit``) on
   the CPU and on the device from the same weights and batches (added after the first H200
   lease: not yet run on a GPU);
6. bsr_paper: the ``paper`` preset's masked-pretraining step (VideoMAE-Base shape) timed, and
   its 40,000 steps extrapolated (added after the first lease: not yet run on a GPU).

Every part writes its record into ``--out/gpu_paper_check.json`` as soon as it ends, so a run
stopped by a time limit keeps what finished. ``--parts`` picks parts (default: all). On a
machine without a GPU every part runs on the CPU and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform as _platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

PARTS = ("atha", "dirclip", "cfr", "timemode", "train", "bsr_paper")
# the paper presets' counts (methods/atha/config.py, methods/dirclip/config.py): BSCD-FSL has
# four target domains
ATHA_DOMAINS = 4
CLASSES = ("zero", "one", "two", "three", "four")  # the generated image folders' classes


def _device() -> torch.device:
    """The GPU when there is one, else the CPU (every part then runs on the CPU)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sides(dev: torch.device) -> tuple[tuple[str, torch.device], ...]:
    """The two sides of a comparison: the CPU and ``dev``."""
    return (("cpu", torch.device("cpu")), ("device", dev))


def _max_rel(losses: dict[str, list[float]]) -> float:
    """The largest relative difference of the device's losses from the CPU's, step by step."""
    return max(abs(c - d) / abs(c) for c, d in zip(losses["cpu"], losses["device"], strict=True))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _now() -> float:
    _sync()
    return time.perf_counter()


@contextlib.contextmanager
def _tf32():
    """TF32 matrix products and convolutions inside the block, the previous flags after it."""
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def _png_folder(root: Path, classes: list[str], per_class: int, seed: int, size: int) -> None:
    """Class folders of random RGB PNGs with a class-dependent mean colour."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = np.full((size, size, 3), 40 + 170 * c / max(len(classes) - 1, 1))
            img = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / name / f"{i}.png")


def _clip(root: Path, arch: str, tiny: bool) -> Path:
    from nshot.nn.hfclip import write_tiny_clip

    words = ["a", "photo", "of", "the", "shape", *CLASSES]
    if tiny:
        return write_tiny_clip(root / arch, words=words, seed=1)
    patch = {"ViT-B-16": 16, "ViT-B-32": 32}[arch]
    return write_tiny_clip(
        root / arch, words=words, seed=1, image_size=224, patch=patch, width=768, layers=12,
        embed=512, context=77, text_width=512, text_layers=12,
    )  # fmt: skip


def atha_part(root: Path, tiny: bool) -> dict:
    from nshot.method import get
    from nshot.methods.atha.data import sample_episode
    from nshot.methods.atha.experiments import unit_checks
    from nshot.methods.atha.paper_data import folder_pool
    from nshot.methods.atha.train import episode_seed, run_episode
    from nshot.nn.backbone import load_backbone

    atha = get("atha")
    names = list(CLASSES)
    queries = 2 if tiny else 15
    _png_folder(root / "atha" / "shapes", names, 10 + queries + 1, 0, 32 if tiny else 64)
    over = {"clip_arch": "ViT-B-16"}
    if tiny:
        over = {"clip_arch": "any", "txtlayer": 0, "rho_block": 1, "epochs": 2}
    cfg = atha.config(
        "paper", clip_path=str(_clip(root / "clip", "ViT-B-16", tiny)),
        data_path=str(root / "atha"), queries=queries, **over,
    )  # fmt: skip
    device = _device()
    t0 = _now()
    bb = load_backbone(cfg.backbone_spec(), device)
    pool = folder_pool(cfg, "shapes", bb.image_size)
    load_s = _now() - t0
    seconds: dict[str, dict[str, float]] = {}
    acc: dict[str, dict[str, float]] = {}
    for shots, systems in ((1, list(cfg.systems)), (5, list(cfg.systems_5shot))):
        ep = sample_episode(pool, seed=cfg.seed, episode=0, n_way=cfg.n_way, shots=shots,
                            queries=cfg.queries)  # fmt: skip
        for s in systems:
            t1 = _now()
            r = run_episode(bb, ep, cfg, s, shots=shots, seed=episode_seed(cfg, pool, 0))
            seconds.setdefault(f"{shots}shot", {})[s] = round(_now() - t1, 3)
            acc.setdefault(f"{shots}shot", {})[s] = float(r["acc"])
    unit = unit_checks(bb, cfg, names[:2])
    tf32 = None
    if device.type == "cuda":
        ep = sample_episode(pool, seed=cfg.seed, episode=0, n_way=cfg.n_way, shots=1,
                            queries=cfg.queries)  # fmt: skip
        with _tf32():
            t1 = _now()
            run_episode(bb, ep, cfg, "atha", shots=1, seed=episode_seed(cfg, pool, 0))
            tf32 = round(_now() - t1, 3)
    per_domain = (
        sum(seconds["1shot"].values()) * cfg.episodes_1shot
        + sum(seconds["5shot"].values()) * cfg.episodes_5shot
    )
    return {
        "clip": cfg.clip_arch, "device": str(device), "epochs": cfg.epochs,
        "lora_r": cfg.lora_r, "queries": cfg.queries, "n_way": cfg.n_way,
        "load_s": round(load_s, 2), "episode_seconds": seconds, "acc_random_weights": acc,
        "unit": unit, "atha_1shot_seconds_tf32": tf32,
        "paper_episodes_per_domain": {"1shot": cfg.episodes_1shot, "5shot": cfg.episodes_5shot},
        "paper_hours_estimate": round(per_domain * ATHA_DOMAINS / 3600, 2),
        "paper_hours_per_domain": round(per_domain / 3600, 2),
    }  # fmt: skip


def dirclip_part(root: Path, tiny: bool) -> dict:
    from nshot.method import get
    from nshot.methods.dirclip.data import splits_of
    from nshot.methods.dirclip.evaluation import evaluate_model, validation
    from nshot.methods.dirclip.experiments import SYSTEMS
    from nshot.methods.dirclip.model import base_clip, build_model
    from nshot.methods.dirclip.train import fit_model

    dirclip = get("dirclip")
    names = list(CLASSES)
    size = 32 if tiny else 64
    steps = 2 if tiny else 20
    n_test = 8 if tiny else 256
    _png_folder(root / "dirclip" / "train", names, 12 if tiny else 120, 0, size)
    _png_folder(root / "dirclip" / "val", names, n_test // len(names) + 1, 1, size)
    over = {"clip_arch": "ViT-B-32"}
    if tiny:
        over = {"clip_arch": "any", "batch_size": 4, "pgd_steps": 2, "apgd_steps": 2}
    val_images = 10 if tiny else 256
    cfg = dirclip.config(
        "paper", clip_path=str(_clip(root / "clip", "ViT-B-32", tiny)),
        data_path=str(root / "dirclip"), steps=steps, warmup=1,
        val_every=steps, val_images=val_images, apgd_images=min(n_test, 64), loss="ucat",
        **over,
    )  # fmt: skip
    device = _device()
    backbone = base_clip(cfg, device)
    splits = splits_of(cfg, backbone.image_size)
    torch.manual_seed(0)
    model = build_model(cfg, backbone, splits.class_names)
    t0 = _now()
    one = cfg.replace(steps=1, val_every=10**6)
    fit_model(one, splits, model)  # warm-up: kernels, allocator
    warm_s = _now() - t0
    t1 = _now()
    fit_model(cfg.replace(val_every=10**6), splits, model)
    step_s = (_now() - t1) / steps
    step_tf32 = None
    if device.type == "cuda":
        with _tf32():
            t5 = _now()
            fit_model(cfg.replace(steps=5, val_every=10**6), splits, model)
            step_tf32 = round((_now() - t5) / 5, 4)
    t4 = time.perf_counter()
    splits.x_train[np.arange(min(cfg.batch_size, len(splits.y_train)))]
    load_s = time.perf_counter() - t4  # one batch's images read from PNG files (8 threads)
    t2 = _now()
    validation(model, splits, cfg, steps)
    val_s_per_image = (_now() - t2) / len(splits.y_val)
    t3 = _now()
    metrics = evaluate_model(model, splits, cfg, cfg.seed)
    eval_s = _now() - t3
    n_eval = len(splits.y_test)
    paper = dirclip.config("paper")
    trained = sum(over is not None for over in SYSTEMS.values())  # `clip` is not trained
    # evaluation cost scaled to the paper's 10,000 Tiny-ImageNet val images (PGD on every
    # image) and its apgd_images; validation every val_every steps on val_images
    pgd_share = eval_s * (n_eval / max(n_eval + cfg.apgd_images, 1))
    eval_paper = (
        pgd_share / n_eval * 10_000
        + (eval_s - pgd_share) / max(cfg.apgd_images, 1) * paper.apgd_images
    )
    vals = paper.steps // paper.val_every
    train_paper = trained * (paper.steps * step_s + vals * paper.val_images * val_s_per_image)
    return {
        "clip": cfg.clip_arch, "device": str(device), "batch_size": cfg.batch_size,
        "train_attack_steps": cfg.train_attack_steps, "pgd_steps": cfg.pgd_steps,
        "apgd_steps": cfg.apgd_steps, "first_step_s": round(warm_s, 3),
        "step_s": round(step_s, 4), "steps_timed": steps, "batch_read_s": round(load_s, 4),
        "step_s_tf32": step_tf32,
        "validation_s_per_image": round(val_s_per_image, 5),
        "eval_s": round(eval_s, 2), "eval_images": n_eval, "apgd_images": cfg.apgd_images,
        "metrics_random_weights": metrics,
        "paper_hours_estimate": round((train_paper + len(SYSTEMS) * eval_paper) / 3600, 2),
        "paper_hours_training": round(train_paper / 3600, 2),
    }  # fmt: skip


def cfr_part(root: Path, tiny: bool) -> dict:
    from nshot.method import get

    cfr = get("cfr")
    out: dict = {"cuda": torch.cuda.is_available()}
    tables = {}
    prev = os.environ.get("NSHOT_IN_PROCESS")
    os.environ["NSHOT_IN_PROCESS"] = "1"  # the jobs in this process, on its GPU; no Ray
    try:
        for gpus in (1, 0):
            cfg = cfr.config("smoke", job_gpus=gpus)
            t0 = _now()
            tables[gpus] = cfr.experiments(cfg, root / f"cfr{gpus}")
            out[f"seconds_job_gpus{gpus}"] = round(_now() - t0, 2)
    finally:
        if prev is None:
            os.environ.pop("NSHOT_IN_PROCESS", None)
        else:
            os.environ["NSHOT_IN_PROCESS"] = prev
    diffs = {}
    for row, vals in tables[0].rows.items():
        for k, v in vals.items():
            g = tables[1].rows[row].get(k)
            if v is not None and g is not None:
                diffs[f"{row}.{k}"] = abs(float(g) - float(v))
    out["max_abs_diff"] = max(diffs.values()) if diffs else None
    out["worst"] = sorted(diffs.items(), key=lambda kv: -kv[1])[:5]
    out["rows_gpu"] = tables[1].rows
    return out


def timemode_part(root: Path, tiny: bool) -> dict:
    from nshot.method import get
    from nshot.methods.timemode.experiments import randomise
    from nshot.methods.timemode.model import Diffusion, build_state
    from nshot.methods.timemode.train import StageData, batch, loss_terms

    cfg = get("timemode").config("smoke" if tiny else "small", stage="pretrain")
    torch.manual_seed(0)
    net = build_state(cfg, 6).net.eval()
    randomise(net, 0)  # adaLN-Zero starts at zero output: compare on random weights
    g = torch.Generator().manual_seed(1)
    x, ex = torch.randn(2, 64, cfg.window, 1, generator=g)
    t = torch.randint(cfg.diffusion_steps, (64,), generator=g)
    dev = _device()
    out: dict = {"device": str(dev)}
    with torch.no_grad():
        net.dispatch = "dense"
        ref = net(x, t, ex).eps
        for where, dispatch in (("cpu", "sparse"), ("device", "dense"), ("device", "sparse")):
            d = torch.device("cpu") if where == "cpu" else dev
            net.to(d).dispatch = dispatch
            got = net(x.to(d), t.to(d), ex.to(d)).eps.cpu()
            out[f"{where}_{dispatch}_max_abs_diff"] = float((got - ref).abs().max())
        net.dispatch = "auto"
        out["auto_on_device"] = "sparse" if dev.type == "cuda" else "dense"
    out["max_abs_value"] = float(ref.abs().max())
    # one training loss and its gradients (noising, forward, router regularisers) on the CPU
    # and on the device, from the same batch
    diffusion = Diffusion(cfg.diffusion_steps, prediction=cfg.prediction)
    data = StageData(["a", "b"], [x[:32].numpy(), ex[32:].numpy()], [], [])
    b = batch(cfg, data, step=1)
    grads = {}
    for where, d in _sides(dev):
        net.to(d).train()
        net.zero_grad(set_to_none=True)
        terms = loss_terms(cfg, net, diffusion, tuple(v.to(d) for v in b))
        terms["loss"].backward()
        out[f"{where}_loss"] = float(terms["loss"].detach())
        grads[where] = torch.cat([p.grad.flatten().cpu() for p in net.parameters()
                                  if p.grad is not None])  # fmt: skip
    out["grad_rel_diff"] = float((grads["device"] - grads["cpu"]).norm() / grads["cpu"].norm())
    return out


def train_part(root: Path, tiny: bool) -> dict:
    """bsr's and timemode's training steps (``nshot train``'s) on the CPU and on the device from
    the same weights and batches: the loss of each step, and the largest difference."""
    import copy

    from nshot.method import get
    from nshot.methods.bsr.data import MONTAGE_A
    from nshot.methods.bsr.train import Clips, new_pretrainer, pretrain_step
    from nshot.methods.timemode.experiments import randomise
    from nshot.methods.timemode.model import build_state
    from nshot.methods.timemode.train import StageData, fit, new_optimizer

    dev = _device()
    out: dict = {"device": str(dev)}
    steps = 3
    # bsr: the pretrainer on random spectrum powers through a random interpolation matrix
    cfg = get("bsr").config("smoke" if tiny else "small")
    g = torch.Generator().manual_seed(0)
    powers = torch.randn(64, cfg.frames, 3, len(MONTAGE_A), generator=g).numpy()
    clips = Clips(powers, torch.randn(cfg.grid**2, len(MONTAGE_A), generator=g), cfg.grid)
    idx = np.arange(64)
    model, _ = new_pretrainer(cfg)
    losses = {}
    for where, d in _sides(dev):
        m = copy.deepcopy(model).to(d)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), foreach=True)
        losses[where] = [pretrain_step(cfg, m, opt, clips, idx, s)[0] for s in range(1, steps + 1)]
    out["bsr_losses"] = losses
    out["bsr_max_abs_diff"] = max(
        abs(c - d) for c, d in zip(losses["cpu"], losses["device"], strict=True)
    )
    # timemode: fit() from the same randomised state on random windows of two domains
    tcfg = get("timemode").config(
        "smoke" if tiny else "small", stage="pretrain", pretrain_steps=steps
    )
    x = torch.randn(2, 64, tcfg.window, 1, generator=g).numpy()
    data = StageData(["a", "b"], [x[0], x[1]], [], [])
    torch.manual_seed(0)
    state = build_state(tcfg, 2)
    randomise(state.net, 0)
    state.ema.load_state_dict(state.net.state_dict())
    losses = {}
    for where, d in _sides(dev):
        st = copy.deepcopy(state).to(d)
        seen: list[float] = []
        fit(tcfg, data, state=st, opt=new_optimizer(tcfg, st),
            on_step=lambda _s, terms, seen=seen: seen.append(terms["loss"]))  # fmt: skip
        losses[where] = seen
    out["timemode_losses"] = losses
    out["timemode_max_rel_diff"] = _max_rel(losses)
    # tgdt: fit() (L_DT + L_TBC + L_TBM) on the PointRobot data from the same initial weights
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.train import build_model
    from nshot.methods.tgdt.train import fit as tgdt_fit
    from nshot.methods.tgdt.train import new_optimizer as tgdt_optimizer

    gcfg = get("tgdt").config("smoke", steps=steps)
    gdata = load_data(gcfg)
    gmodel = build_model(gcfg, gdata)
    losses = {}
    for where, d in _sides(dev):
        m = copy.deepcopy(gmodel).to(d)
        seen = []
        tgdt_fit(gcfg, gdata, model=m, opt=tgdt_optimizer(gcfg, m),
                 on_step=lambda _s, terms, seen=seen: seen.append(terms["loss"]))  # fmt: skip
        losses[where] = seen
    out["tgdt_losses"] = losses
    out["tgdt_max_rel_diff"] = _max_rel(losses)
    return out


def bsr_paper_part(root: Path, tiny: bool) -> dict:
    """bsr's ``paper`` pretraining step (VideoMAE-Base, 224², 16 frames, batch 64, mask 0.9)
    on random spectrum powers: seconds a step after one warm-up step, and the preset's
    40,000 steps extrapolated."""
    from nshot.method import get
    from nshot.methods.bsr.data import MONTAGE_A
    from nshot.methods.bsr.train import Clips, new_pretrainer, pretrain_step

    dev = _device()
    # The paper preset's shape from a random start: its pretrained weights (``videomae``) do
    # not change what a step costs.
    bsr = get("bsr")
    cfg = bsr.config("smoke") if tiny else bsr.config("paper", backbone="videomae-scratch")
    g = torch.Generator().manual_seed(0)
    n = 2 * cfg.batch
    powers = torch.randn(n, cfg.frames, 3, len(MONTAGE_A), generator=g).numpy()
    clips = Clips(powers, torch.randn(cfg.grid**2, len(MONTAGE_A), generator=g), cfg.grid)
    model, opt = new_pretrainer(cfg)
    model.to(dev)
    idx = np.arange(n)
    t0 = _now()
    pretrain_step(cfg, model, opt, clips, idx, 1)
    first = _now() - t0
    timed = 3
    t1 = _now()
    losses = [pretrain_step(cfg, model, opt, clips, idx, s)[0] for s in range(2, timed + 2)]
    step_s = (_now() - t1) / timed
    return {
        "device": str(dev), "grid": cfg.grid, "frames": cfg.frames, "width": cfg.width,
        "depth": cfg.depth, "batch": cfg.batch, "mask_ratio": cfg.mask_ratio,
        "first_step_s": round(first, 3), "step_s": round(step_s, 4), "losses": losses,
        "paper_steps": cfg.steps, "paper_hours_estimate": round(cfg.steps * step_s / 3600, 2),
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if dev.type == "cuda" else None,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_paper_check.json")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (CPU, seconds)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "cuda": torch.cuda.is_available(),
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__, "python": _platform.python_version(), "tiny": args.tiny,
    }  # fmt: skip
    if not torch.cuda.is_available():
        print("no CUDA device visible: every part runs on the CPU", flush=True)
    fns = {"atha": atha_part, "dirclip": dirclip_part, "cfr": cfr_part,
           "timemode": timemode_part, "train": train_part,
           "bsr_paper": bsr_paper_part}  # fmt: skip
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            t0 = time.time()
            try:
                report[part] = fns[part](Path(tmp) / part, args.tiny)
            except Exception as err:  # noqa: BLE001 - record it, go on to the next part
                import traceback

                report[part] = {"error": f"{type(err).__name__}: {err}",
                                "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
                failed.append(part)
            report[part]["wall_s"] = round(time.time() - t0, 1)
            (out / "gpu_paper_check.json").write_text(json.dumps(report, indent=1, default=str))
            print(f"[gpu_paper_check] {part}: {json.dumps(report[part], default=str)[:1500]}",
                  flush=True)  # fmt: skip
    print(f"[gpu_paper_check] wrote {out / 'gpu_paper_check.json'}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
