"""ZeroUnlearn as an nshot Method."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import CheckpointError, LoadedCheckpoint

from .claims import CLAIMS
from .config import ZeroUnlearnConfig
from .serve import ZeroUnlearnPredictor

METRICS = {"eff": False, "gen": False, "spe": True, "ppl": False, "neutral_rate": True}


def checkpoint_extra(s: Any, result: dict[str, Any]) -> dict[str, Any]:
    """JSON state of a run: model source and fingerprint, seed, context templates, requests.

    The forgotten facts are kept here (``evaluate`` needs them); the predictor's metadata only
    reports how many there are."""
    return {
        "model": s.cfg.model,
        "model_fingerprint": s.fingerprint,
        "seed": s.seed,
        "context_templates": s.templates,
        "neutral_target": s.tok.eos_token,
        "forget": [r.to_json() for r in s.forget],
        "retain": [r.to_json() for r in s.retain],
        "setup": s.info,
        "metrics": result["metrics"],
        "diagnostics": _jsonable(result["diagnostics"]),
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float | int | str | bool) or obj is None:
        return obj
    return str(obj)


@register
class ZeroUnlearnMethod(Method):
    name = "zerounlearn"
    paper = "ZeroUnlearn: few-shot LLM unlearning as knowledge re-mapping"
    area = "few-shot LLM unlearning (model editing)"
    version = "1"
    Config = ZeroUnlearnConfig
    claims = CLAIMS

    def data(self, cfg: ZeroUnlearnConfig) -> dict[str, pa.Table]:
        """Candidate facts (before the per-model filter) and the general text splits."""
        from nshot.data.lmtext import general_text

        from .pipeline import candidate_requests

        reqs = candidate_requests(cfg)
        facts = pa.table(
            {
                "relation": [r.relation for r in reqs],
                "subject": [r.subject for r in reqs],
                "answer": [r.answer for r in reqs],
                "rewrite_template": [r.template for r in reqs],
                "paraphrases": [list(r.paraphrases) for r in reqs],
            }
        )
        return {
            "facts": facts,
            "general_train": pa.table({"text": general_text("train")}),
            "general_heldout": pa.table({"text": general_text("heldout")}),
        }

    def train_loop(self, cfg: ZeroUnlearnConfig) -> None:
        """The edit on rank 0 with full weights; reports the metrics before and after."""
        from nshot.train import session

        from .pipeline import run_systems, setup

        ctx = session.context()
        s = setup(cfg, cfg.seed)
        system = {"zerounlearn": "zerounlearn", "gd": "zerounlearn_gd"}.get(
            cfg.variant, cfg.variant
        )
        result = run_systems(s, ("base", system), keep=system)
        after = result["metrics"][system]
        before = result["metrics"]["base"]
        metrics = {**after, **{f"{k}_before": v for k, v in before.items()}}
        weights = result["kept"]
        if ctx.rank != 0:
            weights = {k: torch.zeros(0) for k in weights}
        session.report(
            metrics,
            step=1,
            model=weights,
            extra=checkpoint_extra(s, result),
            checkpoint=True,
        )

    def predictor(self, checkpoint: LoadedCheckpoint) -> ZeroUnlearnPredictor:
        return ZeroUnlearnPredictor.from_checkpoint(checkpoint)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: ZeroUnlearnConfig) -> dict[str, float]:
        """Eff, Gen, Spe, PPL and the neutral rate of the checkpoint's edited model on its own facts."""
        from nshot.data.lmtext import general_text

        from .edit import EditRequest, load_edited_weights, model_fingerprint
        from .evaluation import EvalSet, evaluate_model, ppl_chunks
        from .pipeline import load_model

        extra = checkpoint.extra
        if "forget" not in extra:
            raise CheckpointError(f"checkpoint {checkpoint.path} has no request list")
        model, tok = load_model(cfg)
        if model_fingerprint(model, model.config.num_hidden_layers - 1) != extra.get(
            "model_fingerprint"
        ):
            raise CheckpointError(
                f"checkpoint {checkpoint.path}: base model {cfg.model!r} is not the edited one"
            )
        load_edited_weights(model, checkpoint.weights())
        chunks = ppl_chunks(tok, general_text("heldout"), cfg.ppl_chunks, cfg.ppl_length)
        es = EvalSet(
            tuple(EditRequest.from_json(r) for r in extra["forget"]),
            tuple(EditRequest.from_json(r) for r in extra["retain"]),
            tuple(tuple(c) for c in chunks),
        )
        return evaluate_model(model, tok, es)

    def experiments(self, cfg: ZeroUnlearnConfig, workdir: Path) -> ResultsTable:
        """ZeroUnlearn, -GD, the ablations and the baselines on the same facts, per seed."""
        import ray

        from nshot.train import ensure_ray

        t0 = time.time()
        seeds = [cfg.seed + i for i in range(cfg.experiment_seeds)]
        workdir = Path(workdir)
        if cfg.parallel_seeds and len(seeds) > 1:
            ensure_ray()
            res = _seed_task_resources(cfg)
            # statistics first (cached), so that the seed tasks do not all compute them
            ray.get(ray.remote(**res)(_warm_stats).remote(cfg))
            task = ray.remote(**res)(_run_seed)
            outs = ray.get([task.remote(cfg, s, str(workdir)) for s in seeds])
        else:
            outs = [_run_seed(cfg, s, str(workdir)) for s in seeds]
        return results_table(cfg, outs, runtime_s=time.time() - t0, method=self.name)


def results_table(
    cfg: ZeroUnlearnConfig, outs: list[dict[str, Any]], *, runtime_s: float, method: str
) -> ResultsTable:
    """Means and stds over seeds of every system's metrics; the per-seed values are kept as the
    claims' paired samples (``samples[system][metric]``, in seed order) and in ``per_seed``."""
    from .pipeline import SYSTEMS

    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    samples: dict[str, dict[str, list[float | None]]] = {}
    for system in SYSTEMS:
        rows[system], stds[system], samples[system] = {}, {}, {}
        for metric in METRICS:
            vals = np.array([o["metrics"][system][metric] for o in outs], dtype=float)
            rows[system][metric] = float(vals.mean())
            stds[system][metric] = float(vals.std(ddof=1)) if len(vals) > 1 else None
            samples[system][metric] = [float(v) for v in vals]
    return ResultsTable(
        method=method,
        preset=cfg.preset,
        seeds=len(outs),
        metrics=METRICS,
        rows=rows,
        stds=stds,
        runtime_s=runtime_s,
        notes=_notes(cfg, outs),
        extra={
            "per_seed": [
                {"seed": o["seed"], "metrics": o["metrics"], "timings": o["timings"]} for o in outs
            ],
            "diagnostics": [_jsonable(o["diagnostics"]) for o in outs],
            "setup": [o["setup"] for o in outs],
            "checkpoints": {f"zerounlearn-seed{o['seed']}": o["checkpoint"] for o in outs},
        },
        samples=samples,
    )


def _seed_task_resources(cfg: ZeroUnlearnConfig) -> dict[str, float]:
    """Ray resources of one seed task: a CPU, plus a whole GPU when the cluster has GPUs and
    ``device`` lets the task pick one (``auto``/``cuda``: Ray then makes the task's own GPU
    its only visible, current device). ``cuda:N`` and ``cpu`` are taken literally (CPU tasks)."""
    import ray

    if cfg.device in ("auto", "cuda") and ray.cluster_resources().get("GPU", 0) >= 1:
        return {"num_cpus": 1, "num_gpus": 1}
    return {"num_cpus": 1}


def _warm_stats(cfg: ZeroUnlearnConfig) -> None:
    from nshot.data.lmtext import general_text

    from .edit import key_statistics
    from .pipeline import load_model

    torch.set_num_threads(cfg.torch_threads)
    model, tok = load_model(cfg)
    key_statistics(model, tok, general_text("train"), cfg.edit_layers, cfg.stats_positions)


def _run_seed(cfg: ZeroUnlearnConfig, seed: int, workdir: str) -> dict[str, Any]:
    """All systems of one seed (a Ray task); saves the ZeroUnlearn edit as a checkpoint."""
    from nshot.train.checkpoint import save_checkpoint

    from .pipeline import run_systems, setup

    torch.set_num_threads(cfg.torch_threads)
    t0 = time.time()
    scfg = cfg.replace(seed=seed)
    s = setup(scfg, seed)
    result = run_systems(s)
    path = save_checkpoint(
        Path(workdir) / "runs" / f"zerounlearn-seed{seed}",
        method="zerounlearn",
        method_version=ZeroUnlearnMethod.version,
        config=scfg.model_dump(),
        step=1,
        model_state=result["kept"],
        metrics=result["metrics"]["zerounlearn"],
        extra=checkpoint_extra(s, result),
    )
    result["timings"]["total"] = time.time() - t0
    return {
        "seed": seed,
        "metrics": result["metrics"],
        "diagnostics": result["diagnostics"],
        "timings": result["timings"],
        "setup": s.info,
        "checkpoint": str(path),
    }


def _notes(cfg: ZeroUnlearnConfig, outs: list[dict[str, Any]]) -> list[str]:
    s0 = outs[0]["setup"]
    notes = [
        f"model {cfg.model}; edited layers {cfg.edit_layers}, v_loss_layer {cfg.v_loss_layer}; "
        f"{cfg.n_forget} forgotten facts per seed, {len(outs)} seeds; ± is the std over seeds.",
        f"facts: {s0['known']} of {s0['candidates']} candidates known by the model "
        f"(teacher-forced argmax on the rewrite prompt), relations "
        f"{', '.join(cfg.relations) if not cfg.model.startswith('tiny-') else 'synthetic'}; "
        f"retain pool {s0['retain_pool']}; "
        f"rewrite prompt {cfg.rewrite_prompt}, pools split by {cfg.split}, key statistics "
        f"{'consistent (VKT = W·KKT)' if cfg.consistent_stats else 'as the paper (centred VKT)'}.",
        f"eff/gen/spe/neutral_rate in %, teacher-forced argmax; ppl on {s0['ppl_tokens']} "
        f"held-out docstring tokens ({cfg.ppl_chunks} chunks of ≤ {cfg.ppl_length}).",
        f"key statistics from {s0['stats_positions']} general-text positions; "
        f"{cfg.context_templates} sampled context templates + the bare one; neutral target "
        f"{s0['neutral_target']!r}.",
    ]
    return notes
