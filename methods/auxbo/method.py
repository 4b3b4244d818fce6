"""auxbo as an nshot Method: meta-training under Ray Train, evaluation, serving, experiments."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from nshot.method import Method, NshotError, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import (
    ModelBudget,
    bounded_ints,
    meta_counts,
    transformer_activation_bytes,
)

from .claims import CLAIMS
from .config import AuxBOConfig
from .model import (
    TNP,
    TNPConfig,
    evaluate_prediction,
    family_stats,
    nll_loss,
    sample_batch,
    save_tnp,
)
from .tasks import Task


def _log(msg: str) -> None:
    print(f"[auxbo] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- task families


def history_family(cfg: AuxBOConfig) -> tuple[list[Task], list[Task], dict[str, Any]]:
    """Tasks from the sweep history of ``cfg.history_method`` (the most recent search space)."""
    from nshot.tune.history import load_tasks

    tasks = load_tasks(cfg.history_dir, method=cfg.history_method)
    if not tasks:
        raise NshotError(
            f"family=history: no sweeps of {cfg.history_method!r} in the history; run "
            f"`nshot tune {cfg.history_method} ...` first"
        )
    space_hash = tasks[-1].space_hash
    same = [t for t in tasks if t.space_hash == space_hash]
    widths = set()
    out = []
    for t in same:
        h, mask = t.h_padded()
        h = np.where(mask[..., None], h, np.nan).astype(np.float32)  # NaN frames = padding
        widths.add(h.shape[-1])
        out.append(
            Task(
                name=f"history/{t.task_id}",
                family="history",
                X=t.X.astype(np.float32),
                f=t.y.astype(np.float32),
                h=h,
                h_names=tuple(f"h{i}" for i in range(h.shape[-1])),
                configs=t.configs,
            )
        )
    if len(widths) > 1:
        raise NshotError(f"family=history: sweeps of one space report h of widths {widths}")
    T = max(t.h.shape[1] for t in out)
    for t in out:  # one h length for the family
        if t.h.shape[1] < T:
            pad = np.full((t.h.shape[0], T - t.h.shape[1], t.h.shape[2]), np.nan, np.float32)
            t.h = np.concatenate([t.h, pad], axis=1)
    n_test = len(out) // 5
    train, test = out[: len(out) - n_test], out[len(out) - n_test :] or out[-1:]
    info = {"space": same[-1].space, "space_hash": space_hash, "method": cfg.history_method}
    return train, test, info


def load_family(
    cfg: AuxBOConfig, family: str | None = None
) -> tuple[list[Task], list[Task], dict[str, Any]]:
    """``(history tasks, held-out tasks, info)`` of ``family`` (default ``cfg.family``)."""
    from . import tasks as T

    family = family or cfg.family
    if family == "synthetic":
        train, test = T.synthetic_family(
            n_train=cfg.n_train_tasks,
            n_test=cfg.n_test_tasks,
            n_candidates=cfg.n_candidates,
            seed=cfg.seed,
        )
        return train, test, {"space": None, "space_hash": None}
    if family == "lcbench":
        train, test = T.lcbench_family(
            n_configs=cfg.lcbench_configs,
            seed=cfg.seed,
            variant=cfg.lcbench_variant,
            n_tasks=cfg.lcbench_tasks if cfg.lcbench_variant == "perturbed" else None,
            extra_test=cfg.lcbench_extra_test if cfg.lcbench_variant == "perturbed" else 0,
        )
        if cfg.lcbench_objective == "neg_log_loss":
            k = list(train[0].h_names).index("val_loss")
            for t in (*train, *test):
                t.f = (-t.h[:, -1, k]).astype(np.float32)
        space = T.lcbench_tune_space(cfg.lcbench_variant)
        return train, test, {"space": space, "space_hash": None}
    if family == "history":
        return history_family(cfg)
    raise NshotError(f"unknown task family {family!r}")


def tnp_config(cfg: AuxBOConfig, tasks: list[Task], use_h: bool | None = None) -> TNPConfig:
    t = tasks[0]
    return TNPConfig(
        x_dim=int(t.X.shape[1]),
        h_len=int(t.h.shape[1]),
        h_dim=int(t.h.shape[2]),
        d=cfg.d,
        heads=cfg.heads,
        layers_h=cfg.layers_h,
        layers=cfg.layers,
        use_h=cfg.use_h if use_h is None else use_h,
    )


def batch_shape(cfg: AuxBOConfig, tasks: list[Task]) -> tuple[int, int]:
    """``(n_max, m_targets)`` that fit the smallest task (history tasks can be small)."""
    smallest = min(len(t.f) for t in tasks)
    if smallest < 2:
        raise NshotError("every task needs at least 2 evaluated designs")
    m = min(cfg.m_targets, smallest - 1)
    return max(1, min(cfg.n_max, smallest - m)), m


SELECT_CONTEXTS = (1, 2, 5, 10)  # context sizes whose mean NLL picks the step (select_tasks)


def selection_split(cfg: AuxBOConfig, train: list[Task]) -> tuple[list[Task], list[Task]]:
    """``(fit, select)``: ``cfg.select_tasks`` history tasks held back (seeded) for picking the
    meta-training step; ``select`` is empty when ``select_tasks`` is 0."""
    k = cfg.select_tasks
    if k == 0:
        return list(train), []
    if k >= len(train):
        raise NshotError(
            f"select_tasks={k} leaves no history task to train on ({len(train)} history tasks)"
        )
    perm = np.random.default_rng([cfg.seed, 7919]).permutation(len(train))
    held = set(int(i) for i in perm[:k])
    fit = [t for i, t in enumerate(train) if i not in held]
    return fit, [train[i] for i in sorted(held)]


def selection_nll(
    model: TNP,
    tasks: list[Task],
    m: int,
    stats: dict[str, Any],
    seed: int,
    h_shuffle: bool = False,
) -> float:
    """Mean NLL over :data:`SELECT_CONTEXTS` (those that fit) on held-back history tasks
    (``h_shuffle``: with every context h taken from another design of the same task)."""
    smallest = min(len(t.f) for t in tasks)
    sizes = tuple(n for n in SELECT_CONTEXTS if n + m <= smallest) or (1,)
    pred = evaluate_prediction(
        model, tasks, sizes, min(m, smallest - max(sizes)), stats, seed=seed, h_shuffle=h_shuffle
    )
    return float(np.mean([pred[n]["nll"] for n in sizes]))


def meta_train(
    cfg: AuxBOConfig,
    train: list[Task],
    stats: dict[str, Any],
    use_h: bool,
    *,
    progress: str | None = None,
    selection: dict[str, Any] | None = None,
    h_shuffle: bool = False,
) -> tuple[TNP, list[float]]:
    """Meta-train one TNP in-process (used by experiments(); train_loop reports through Ray).

    ``h_shuffle`` (needs ``use_h``): every context h, in training and in the step selection, is
    the h of another random design of the same task, so the model can learn what the set of h
    values says about the task but nothing about the individual design (the ``h_set`` control).
    With ``cfg.select_tasks`` > 0 the model is trained on the other history tasks and the
    returned weights are those of the evaluated step (every ``cfg.select_every``) with the
    lowest :func:`selection_nll` on the held-back ones; ``selection`` (a dict, if given)
    receives ``best_step``, ``best_nll``, ``steps`` and ``nll`` (the curve)."""
    if h_shuffle and not use_h:
        raise ValueError("h_shuffle needs a model that reads h (use_h=True)")
    torch.manual_seed(cfg.seed)
    fit, held = selection_split(cfg, train)
    model = TNP(tnp_config(cfg, train, use_h))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    n_max, m = batch_shape(cfg, train)
    losses = []
    t0 = time.time()
    window = []
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    curve_steps: list[int] = []
    curve_nll: list[float] = []
    train = fit
    for step in range(1, cfg.steps + 1):
        rng = np.random.default_rng([cfg.seed, step])
        batch = sample_batch(train, cfg.batch_tasks, n_max, m, rng, stats, h_shuffle=h_shuffle)
        loss = nll_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window.append(float(loss.detach()))
        if held and (step % cfg.select_every == 0 or step == cfg.steps):
            val = selection_nll(model, held, m, stats, cfg.seed, h_shuffle=h_shuffle)
            model.train()
            curve_steps.append(step)
            curve_nll.append(val)
            if best is None or val < best[0]:
                best = (val, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if step % cfg.log_every == 0 or step == cfg.steps:
            losses.append(float(np.mean(window)))
            window = []
            if progress:
                sel = f", held-back nll {curve_nll[-1]:.3f}" if curve_nll else ""
                _log(
                    f"{progress}: step {step}/{cfg.steps} nll {losses[-1]:.3f}{sel} "
                    f"({time.time() - t0:.0f}s)"
                )
    if best is not None:
        model.load_state_dict(best[2])
        if progress:
            _log(f"{progress}: kept step {best[1]} (held-back nll {best[0]:.3f})")
        if selection is not None:
            selection.update(
                best_step=best[1], best_nll=best[0], steps=curve_steps, nll=curve_nll,
                tasks=[t.name for t in held],
            )  # fmt: skip
    model.eval()
    return model, losses


# --------------------------------------------------------------------------- the Method


#: what the TNP sizes recorded in an auxbo checkpoint may be (every preset is far inside)
TNP_BOUNDS = {
    "x_dim": (1, 4096), "h_len": (1, 100_000), "h_dim": (1, 4096), "d": (4, 4096),
    "heads": (1, 64), "layers_h": (0, 32), "layers": (1, 64), "mlp_ratio": (1, 16),
}  # fmt: skip


@register
class AuxBOMethod(Method):
    name = "auxbo"
    paper = "Few-shot Bayesian optimisation with auxiliary information (ICML 2026)"
    area = "few-shot Bayesian optimisation / hyperparameter tuning"
    version = "1"
    Config = AuxBOConfig
    claims = CLAIMS

    def data(self, cfg: AuxBOConfig) -> dict[str, pa.Table]:
        from .tasks import tasks_to_table

        train, test, _ = load_family(cfg)
        return {"train": tasks_to_table({"train": train}), "test": tasks_to_table({"test": test})}

    def train_loop(self, cfg: AuxBOConfig) -> None:
        from nshot.train import session

        ctx = session.context()
        train, test, info = load_family(cfg)
        stats = family_stats(train)
        tcfg = tnp_config(cfg, train)
        torch.manual_seed(cfg.seed)
        model = session.prepare_model(TNP(tcfg))
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        restored = session.restore(model, opt)
        start = restored.step if restored else 0
        n_max, m = batch_shape(cfg, train)
        train, held = selection_split(cfg, train)  # held: picks the step that is kept
        best: tuple[float, int, dict[str, torch.Tensor]] | None = None
        val = test[: cfg.eval_tasks]
        n_val = min(5, n_max, min(len(t.f) for t in val) - 1)
        extra = {
            "tnp": tcfg.to_dict(),
            "stats": stats,
            "family": cfg.family,
            "space": info.get("space"),
            "space_hash": info.get("space_hash"),
            "history_method": info.get("method"),
            "tasks": {"train": len(train), "held_back": len(held), "test": len(test)},
        }
        window = []
        for step in range(start + 1, cfg.steps + 1):
            session.maybe_inject_fault(step, restored)
            rng = np.random.default_rng([cfg.seed, step, ctx.rank])
            batch = sample_batch(train, cfg.batch_tasks, n_max, m, rng, stats)
            model.train()
            loss = nll_loss(model, batch)  # through the DDP wrapper when there is one
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            window.append(float(loss.detach()))
            is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
            select = bool(held) and (step % cfg.select_every == 0 or step == cfg.steps)
            if select:
                net = session.unwrap(model)
                sel = selection_nll(net, held, m, stats, cfg.seed)
                if best is None or sel < best[0]:
                    best = (sel, step, {k: v.detach().clone() for k, v in net.state_dict().items()})
                if step == cfg.steps:  # the final checkpoint holds the selected step's weights
                    net.load_state_dict(best[2])
                    sel = best[0]
                    _log(f"kept step {best[1]} (held-back nll {best[0]:.3f})")
            if step % cfg.log_every == 0 or is_ckpt or select:
                net = session.unwrap(model)
                net.eval()
                pred = evaluate_prediction(
                    net, val, n_ctx_list=(n_val,), m_targets=m, stats=stats, seed=cfg.seed
                )
                metrics = {"loss": float(np.mean(window or [float("nan")])),
                           "val_nll": pred[n_val]["nll"], "val_mse": pred[n_val]["mse"]}  # fmt: skip
                if best is not None:
                    metrics.update(select_nll=sel if select else best[0], kept_step=best[1])
                window = []
                session.report(
                    metrics,
                    step=step,
                    model=model,
                    optimizer=opt,
                    extra=extra,
                    checkpoint=is_ckpt,
                    samples=cfg.batch_tasks,
                )
        if cfg.family == "history" and ctx.rank == 0 and info.get("space_hash"):
            from .searcher import surrogate_dir_for_hash

            folder = save_tnp(
                session.unwrap(model), stats, surrogate_dir_for_hash(info["space_hash"]),
                extra={k: extra[k] for k in ("space", "space_hash", "history_method")},
            )  # fmt: skip
            _log(f"surrogate for space {info['space_hash']} saved to {folder}")

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: AuxBOConfig) -> dict[str, float]:
        from .bo import RandomProposer, TNPProposer, run_bo, simple_regret

        model, stats = load_from_checkpoint(checkpoint)
        family = checkpoint.extra.get("family", cfg.family)
        _, test, _ = load_family(cfg, family)
        test = test[: cfg.eval_tasks]
        smallest = min(len(t.f) for t in test)
        sizes = tuple(n for n in (1, 2, 5, 10, 20) if n < smallest - 1)
        m = min(cfg.m_targets, smallest - max(sizes))
        out: dict[str, float] = {}
        pred = evaluate_prediction(
            model, test, n_ctx_list=sizes, m_targets=m, stats=stats, seed=cfg.seed
        )
        for n, r in pred.items():
            out[f"nll_ctx{n}"] = r["nll"]
            out[f"mse_ctx{n}"] = r["mse"]
        budget = min(cfg.budget, smallest)
        for name, prop in (
            ("auxbo", TNPProposer(model, stats, xi=cfg.xi)),
            ("random", RandomProposer()),
        ):
            regrets = np.stack(
                [
                    simple_regret(t, run_bo(t, prop, budget, cfg.n_init, seed=cfg.seed + i))
                    for i, t in enumerate(test)
                ]
            )
            for k in sorted({min(5, budget), min(10, budget), budget}):
                out[f"{name}_regret_at_{k}"] = float(regrets[:, k - 1].mean())
        return out

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import AuxBOPredictor

        return AuxBOPredictor(checkpoint)

    def model_budget(
        self, cfg: AuxBOConfig, extra: dict[str, Any] | None = None
    ) -> ModelBudget | None:
        """The TNP of the recorded ``extra["tnp"]`` sizes, counted on the meta device (its
        input widths come from the data, so a config alone gives ``None``); activations: one
        forward pass of the predictor at the Request caps (the whole context and one chunk of
        candidates in one sequence), and every context point's h sequence through the
        h-encoder."""
        from . import serve

        tnp = (extra or {}).get("tnp")
        if tnp is None:
            return None
        bounded_ints(tnp, TNP_BOUNDS, "extra.tnp", required=False)
        tcfg = TNPConfig.from_dict(tnp)
        params, state = meta_counts(lambda: TNP(tcfg))
        n, m = serve.MAX_CONTEXT, serve.CANDIDATE_CHUNK  # one forward pass at the caps
        mlp = tcfg.mlp_ratio * tcfg.d
        act = transformer_activation_bytes(n + m, tcfg.d, tcfg.heads, mlp)
        if tcfg.use_h:
            act += transformer_activation_bytes(tcfg.h_len, tcfg.d, tcfg.heads, mlp, batch=n)
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def experiments(self, cfg: AuxBOConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)


def load_from_checkpoint(checkpoint: LoadedCheckpoint) -> tuple[TNP, dict[str, Any]]:
    extra = checkpoint.extra
    if "tnp" not in extra or "stats" not in extra:
        raise NshotError(f"{checkpoint.path}: not an auxbo surrogate checkpoint (no TNP config)")
    model = TNP(TNPConfig.from_dict(extra["tnp"]))
    model.load_state_dict(checkpoint.weights())
    model.eval()
    return model, dict(extra["stats"])
