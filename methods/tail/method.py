"""TAIL as an nshot Method."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, meta_counts, transformer_activation_bytes

from .claims import CLAIMS
from .config import TailConfig
from .evaluation import default_settings, evaluate_systems, tail_system
from .serve import TailPredictor
from .train import train_loop


@register
class TailMethod(Method):
    name = "tail"
    paper = "TAIL: universal algorithm-implicit meta-learner"
    area = "few-shot classification"
    version = "1"
    Config = TailConfig
    claims = CLAIMS

    def data(self, cfg: TailConfig) -> dict[str, pa.Table]:
        """The real evaluation data as Arrow tables (training episodes are generated per step)."""
        from nshot.data import digits_table, load_features_parquet, mnist_table

        from .evaluation import text_available

        tables = {"digits": digits_table(), "mnist": mnist_table()}
        if text_available():
            from nshot.data import text_table

            tables["text"] = text_table()
        if cfg.features_path:
            tables["features"] = load_features_parquet(cfg.features_path)
        return tables

    def train_loop(self, cfg: TailConfig) -> None:
        train_loop(cfg)

    def predictor(self, checkpoint: LoadedCheckpoint) -> TailPredictor:
        return TailPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: TailConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """Υ's size (built on the meta device) and one episode's activations at the request
        caps: ``MAX_SUPPORT`` support rows and ``MAX_QUERIES`` queries in one sequence; the checkpoint holds Υ's whole state dict."""
        from . import serve
        from .model import TailModel

        params, state = meta_counts(lambda: TailModel(cfg))
        seq = serve.MAX_SUPPORT + serve.MAX_QUERIES
        act = transformer_activation_bytes(seq, cfg.width, cfg.heads, cfg.mlp_dim)
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: TailConfig) -> dict[str, float]:
        settings = default_settings()
        if cfg.features_path:
            from .evaluation import Setting

            settings.append(Setting("acc_features_5w5s", cfg.features_path, 5, 5))
        res = evaluate_systems(
            {"tail": tail_system(TailPredictor.from_checkpoint(checkpoint))},
            settings,
            episodes=cfg.eval_episodes,
            draws=cfg.eval_draws,
        )["tail"]
        out: dict[str, float] = {}
        for metric, val in res.items():
            if val is not None:
                out[metric] = val[0]
                out[f"{metric}_ci95"] = val[1]
        return out

    def experiments(self, cfg: TailConfig, workdir: Path) -> ResultsTable:
        """TAIL against ProtoHead, LinearProbe and the two ablations on the same episodes, or
        (``experiment=ingredients``) TAIL with twice the depth and with four and sixteen times
        the steps against the same baselines."""
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)

    def quick_evaluation(self, checkpoint: LoadedCheckpoint, cfg: TailConfig) -> ResultsTable:
        """TAIL next to ProtoHead on the same ``min(eval_episodes, 200)`` episodes per setting
        (held-out classes, unseen modalities, real digits and MNIST, 20-way), TAIL averaging the
        checkpoint's ``eval_draws`` (π, ρ) draws as its served answers do: the table ``nshot
        quickstart`` prints. ± is the 95 % confidence interval over episodes.
        ``extra["summary"]``: what this model is and where the long-trained ``small`` model
        stands (``standing.py``, read from the committed ``results/small.json``)."""
        from .standing import long_trained_lines, model_line

        settings = default_settings(include_text=False)
        episodes = min(cfg.eval_episodes, 200)
        systems = {
            "tail": tail_system(TailPredictor.from_checkpoint(checkpoint)),
            "protohead": None,
        }
        draws = cfg.eval_draws
        res = evaluate_systems(systems, settings, episodes=episodes, draws=draws)
        rows = {k: {m: None if v is None else v[0] for m, v in r.items()} for k, r in res.items()}
        cis = {k: {m: None if v is None else v[1] for m, v in r.items()} for k, r in res.items()}
        return ResultsTable(
            method=self.name,
            preset=cfg.preset,
            seeds=1,
            metrics={s.metric: True for s in settings},
            rows=rows,
            stds=cis,
            notes=[
                f"mean accuracy over {episodes} episodes per setting (5 queries per class, the "
                f"same episodes for both systems; TAIL averages {draws} (π, ρ) draws, its "
                "served default); ± is the 95 % confidence interval",
                *(f"{s.metric}: {s.description}" for s in settings),
            ],
            extra={
                "episodes": episodes,
                "draws": draws,
                "spread": "ci95",
                "summary": [model_line(cfg), *long_trained_lines()],
            },
        )

    def benchmark(self, *, preset: str = "small", out: str | None = None) -> dict[str, Any]:
        """``nshot bench tail``: the forward time of inline queries against one sequence per
        query at 100-way 5-shot with 100 queries (``bench.py``), written to ``out`` (default
        ``bench-results/tail-inference.json``) with its ratios to the previous file."""
        from nshot.bench import write_result

        from .bench import COMPARED, inference

        data = inference(preset=preset)
        return write_result("bench-results/tail-inference.json", out, data, list(COMPARED))
