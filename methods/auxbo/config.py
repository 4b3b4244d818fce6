"""auxbo configuration and presets."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Float, Int, TuneSpec

FAMILIES = ("synthetic", "lcbench")


class AuxBOConfig(MethodConfig):
    # what the surrogate is meta-trained on
    family: Literal["synthetic", "lcbench", "history"] = Field(
        "synthetic",
        description="task family: the synthetic family, mini-LCBench (scikit-learn runs), or "
        "the sweep history of `history_method` (then the surrogate also becomes the default "
        "of that search space for `nshot tune --search auxbo`)",
    )
    history_method: str | None = Field(None, description="family=history: the swept method")
    history_dir: str | None = Field(None, description="history directory (default: cache)")
    # TNP sizes
    d: int = Field(64, ge=4, le=4096)
    heads: int = Field(4, ge=1, le=64)
    layers_h: int = Field(1, ge=1, le=32)
    layers: int = Field(3, ge=1, le=64)
    use_h: bool = Field(True, description="False: the f-only ablation")
    # meta-training
    lr: float = Field(3e-4, gt=0.0, le=1.0)
    batch_tasks: int = Field(16, ge=1, le=4096)
    n_max: int = Field(20, ge=1, le=1000, description="largest context size")
    m_targets: int = Field(32, ge=1, le=10_000, description="targets per task and batch")
    grad_clip: float = Field(1.0, gt=0.0)
    select_tasks: int = Field(
        0,
        ge=0,
        le=100_000,
        description="history tasks held back from meta-training (seeded) to pick the step "
        "with the lowest few-shot NLL on them (early stopping against meta-overfitting); 0: "
        "train on every history task and keep the last step",
    )
    select_every: int = Field(250, ge=1, le=1_000_000, description="steps between selections")
    # task families
    n_train_tasks: int = Field(500, ge=1, le=100_000, description="synthetic history tasks")
    n_test_tasks: int = Field(100, ge=1, le=100_000, description="synthetic held-out tasks")
    n_candidates: int = Field(300, ge=8, le=100_000, description="synthetic designs per task")
    synthetic_version: Literal[1, 2] = Field(
        2,
        description="synthetic family: 2 (designs on a torus, h shows how far each coordinate "
        "is from the optimum's with task-level gains, and the set of a task's h values says "
        "nothing of where its optimum lies) or 1 (the first family: h = tanh(A (x - tau)) on "
        "the cube, whose mean over random designs reveals the optimum)",
    )
    lcbench_configs: int = Field(100, ge=8, le=10_000, description="mini-LCBench designs")
    lcbench_variant: Literal["perturbed", "clean"] = Field(
        "clean",
        description="mini-LCBench tasks: 'perturbed' (160 tasks from the bundled datasets with "
        "drawn class subsets, training-set sizes, training-label noise and feature scales, a "
        "wider lr/alpha space) or 'clean' (the original 110 digit-pair/wine/iris/breast-cancer "
        "tasks, easy: about half of each task's configs are within 0.05 nats of the best)",
    )
    lcbench_tasks: int = Field(
        160,
        ge=160,
        le=1000,
        description="perturbed variant: tasks drawn (the 56 held-out tasks are always among the "
        "first 160; every task beyond them is an extra history task)",
    )
    lcbench_extra_test: int = Field(
        0,
        ge=0,
        le=1000,
        description="perturbed variant: tasks beyond the first 160 that are held out too "
        "(seeded), on top of the 56 held-out tasks among the first 160",
    )
    lcbench_objective: Literal["neg_log_loss", "accuracy"] = Field(
        "neg_log_loss",
        description="mini-LCBench f: minus the final validation log-loss, or the final "
        "validation accuracy (saturated: 96 of 110 tasks have configs at 100%, about 29% of "
        "each task's configs reach the best value, so random search solves it in a few trials)",
    )
    # BO
    budget: int = Field(20, ge=1, le=10_000, description="evaluations per BO run")
    n_init: int = Field(1, ge=1, le=1000)
    xi: float = Field(0.01, ge=0.0, le=10.0)
    # evaluate() / experiments()
    eval_tasks: int = Field(20, ge=1, le=100_000, description="held-out tasks in evaluate()")
    families: list[Literal["synthetic", "lcbench"]] = Field(
        default_factory=lambda: list(FAMILIES), min_length=1
    )
    bo_tasks: int = Field(60, ge=1, le=100_000, description="held-out synthetic tasks for BO")
    lcbench_bo_tasks: int = Field(
        60, ge=1, le=100_000, description="held-out mini-LCBench tasks for BO"
    )
    mtgp_history_tasks: int = Field(3, ge=1, le=100)
    mtgp_points: int = Field(20, ge=2, le=10_000, description="history points per MTGP task")
    mtgp_maxiter: int = Field(200, ge=1, le=100_000)
    mtgp_refit_every: int = Field(5, ge=1, le=1000)
    h_set_control: bool = Field(
        False,
        description="experiments(): add the `h_set` row, a third TNP meta-trained (and run) "
        "with every context h replaced by that of another random design of the same task, so "
        "h can tell it about the task but never about the design; it measures how much of "
        "aux-BO's advantage the h-shuffle control cannot remove",
    )
    train_seeds: int = Field(
        1,
        ge=1,
        le=100,
        description="experiments(): meta-training seeds of aux-BO and the f-only TNP on the "
        "`seeded_families`: seed s trains both again with seed `seed + s` on the same tasks and "
        "runs their BO from its own random starts; the per-seed mean regrets are the "
        "`seed_regret_at_k` metrics (seed 0 is the run every other row shares)",
    )
    seeded_families: list[Literal["synthetic", "lcbench"]] = Field(
        default_factory=lambda: ["lcbench"],
        description="experiments(): the families whose aux-BO and f-only rows run `train_seeds` "
        "meta-training seeds",
    )
    # experiments(): the comparison above, or the history curve on nshot's own sweeps
    experiment: Literal["comparison", "history_curve"] = Field(
        "comparison",
        description="experiments(): 'comparison' (the paper's: prediction and BO regret on the "
        "synthetic and mini-LCBench families) or 'history_curve' (sweeps of `history_method` "
        "through `nshot tune`: the best objective after 5 / 10 / 20 trials on held-out tasks for "
        "random search, TPE, the GP and aux-BO meta-trained on `curve_history` earlier sweeps)",
    )
    curve_preset: str = Field("smoke", description="history_curve: the swept method's preset")
    curve_set: dict[str, Any] = Field(
        default_factory=dict, description="history_curve: fields set on every swept config"
    )
    curve_vary: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="history_curve: what makes the tasks differ besides the seed: per field, "
        "the values one task draws from (seeded, one draw per task)",
    )
    curve_history: list[int] = Field(
        default_factory=lambda: [5, 20],
        min_length=1,
        description="history_curve: earlier sweeps each aux-BO row is meta-trained on (and "
        "warm-started from); with none, aux-BO is the GP row",
    )
    curve_history_trials: int = Field(20, ge=4, le=10_000, description="trials per history sweep")
    curve_baselines: list[Literal["random", "optuna_tpe", "gp"]] = Field(
        default_factory=lambda: ["random", "optuna_tpe", "gp"],
        description="history_curve: the searchers without a history that are compared",
    )
    curve_tasks: int = Field(10, ge=2, le=10_000, description="history_curve: held-out tasks")
    curve_trials: int = Field(20, ge=5, le=10_000, description="trials per held-out sweep")
    curve_concurrency: int = Field(2, ge=1, le=1024, description="trials at once in a sweep")
    curve_surrogate_steps: int = Field(1000, ge=1, le=1_000_000)
    curve_m_targets: int = Field(
        5, ge=1, le=10_000, description="history_curve: targets per history task and batch"
    )

    # `nshot tune auxbo`: the surrogate's own meta-training can be swept too
    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={"lr": Float(1e-4, 3e-3, log=True), "layers": Int(1, 4)},
        metric="val_nll",
        mode="min",
        curve=("val_nll", "loss"),
    )

    # `nshot eval --set` may change these (the held-out tasks and the BO loop run with the
    # checkpoint's model); every other field is fixed by the checkpoint, since it shapes the model
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "eval_tasks",
        "budget",
        "n_init",
        "xi",
        "history_dir",
    }
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": dict(
            d=16, heads=2, layers_h=1, layers=1, n_max=5, m_targets=8, batch_tasks=4, steps=30,
            log_every=10, checkpoint_every=30, n_train_tasks=24, n_test_tasks=6,
            n_candidates=60, lcbench_configs=12, budget=3, eval_tasks=4, bo_tasks=4, lcbench_bo_tasks=4,
            families=["synthetic"], mtgp_points=6, mtgp_maxiter=20,
        ),
        "small": dict(
            d=64, heads=4, layers_h=1, layers=3, n_max=20, m_targets=32, batch_tasks=16,
            steps=4000, lr=3e-4, log_every=100, checkpoint_every=1000, n_train_tasks=500,
            n_test_tasks=100, n_candidates=300, lcbench_configs=64, lcbench_variant="perturbed",
            lcbench_tasks=480, lcbench_extra_test=56, select_tasks=40, select_every=250,
            budget=20, eval_tasks=20, bo_tasks=60, lcbench_bo_tasks=112,
            families=["lcbench", "synthetic"], h_set_control=True, train_seeds=3,
        ),
        "paper": dict(
            d=256, heads=8, layers_h=2, layers=6, n_max=30, m_targets=32, batch_tasks=32,
            steps=100_000, lr=1e-4, log_every=500, checkpoint_every=10_000, budget=30,
            n_train_tasks=5000, n_test_tasks=1000, lcbench_configs=200, bo_tasks=100,
            lcbench_extra_test=144, lcbench_bo_tasks=200,
            lcbench_variant="perturbed", lcbench_tasks=1000, select_tasks=100, select_every=2000,
            train_seeds=3,
        ),
    }  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> AuxBOConfig:
        if self.d % self.heads:
            raise ValueError(f"field 'heads': d={self.d} is not divisible by heads={self.heads}")
        if self.family == "history" and not self.history_method:
            raise ValueError("field 'history_method': family=history needs the swept method")
        if self.experiment == "history_curve":
            if not self.history_method:
                raise ValueError(
                    "field 'history_method': experiment=history_curve needs the swept method"
                )
            if any(k < 1 for k in self.curve_history) or len(set(self.curve_history)) != len(
                self.curve_history
            ):
                raise ValueError("field 'curve_history': distinct sweep counts >= 1")
            if any(not v for v in self.curve_vary.values()):
                raise ValueError("field 'curve_vary': every field needs at least one value")
            if self.curve_m_targets >= self.curve_history_trials:
                raise ValueError("field 'curve_m_targets': must be below curve_history_trials")
        if self.n_init > self.budget:
            raise ValueError("field 'n_init': must not exceed budget")
        return self
