"""TG-DT configuration and presets.

One training run trains one system (``system``): the full TG-DT (decision transformer that
cross-attends to a character-level text encoder, trained with L_DT + L_TBC + L_TBM, paper §3),
its ablations without the contrastive (``tgdt_no_tbc``) or the matching loss (``tgdt_no_tbm``)
or both (``tgdt_no_align``: the same cross-attending text DT trained on L_DT alone), and the
baselines of paper §4: ``naive_text_dt`` (the pooled text embedding concatenated to every
token, L_DT only), ``agnostic_dt`` (no task information), ``oracle_dt`` (the true goal
concatenated to every token) and ``prompt_dt`` (Prompt-DT: an expert segment of the task
prepended as prompt tokens; a few-shot reference, not zero-shot).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Choice, Float, TuneSpec

VERSION = "1"  # of the checkpoint format

System = Literal[
    "tgdt", "tgdt_no_tbc", "tgdt_no_tbm", "tgdt_no_align", "naive_text_dt", "agnostic_dt",
    "oracle_dt", "prompt_dt",
]  # fmt: skip
TEXT_SYSTEMS = ("tgdt", "tgdt_no_tbc", "tgdt_no_tbm", "tgdt_no_align", "naive_text_dt")
CROSS_SYSTEMS = ("tgdt", "tgdt_no_tbc", "tgdt_no_tbm", "tgdt_no_align")
# the loss balances that set the alignment weights from measured gradients, and those of them
# that re-measure during training
BALANCED = ("text_grad", "text_grad_running", "shared_grad_running")
RUNNING = ("text_grad_running", "shared_grad_running")


# the environments: (state dim, action dim, goal dim, action bound)
ENVS = {"pointrobot": (2, 2, 2, 0.1), "metaworld": (39, 4, 3, 1.0)}
MW_TASKS = 50  # Meta-World ML1: 50 training and 50 test tasks (goal positions) per class


class TGDTConfig(MethodConfig):
    system: System = Field("tgdt", description="the system this run trains (see the module)")
    # data: the PointRobot generator, or Meta-World ML1 with its scripted experts
    env: Literal["pointrobot", "metaworld"] = Field(
        "pointrobot",
        description="pointrobot (the generated 2-D navigation tasks) or metaworld (ML1 "
        "tasks of mw_env, collected with Meta-World's scripted policies; the metaworld extra)",
    )
    mw_env: str = Field(
        "reach-v3", pattern=r"^[a-z][a-z0-9-]*-v3$", description="metaworld ML1: the class"
    )
    mw_benchmark: Literal["ML1", "ML10"] = Field(
        "ML1",
        description="metaworld: ML1 (goal positions of mw_env; held out: ML1's test tasks) or "
        "ML10 (10 training classes, n_train_tasks / 10 tasks each; held out: the 5 test "
        "classes, n_test_tasks / 5 each: zero-shot to new skills from their descriptions)",
    )
    n_train_tasks: int = Field(45, ge=2, le=1000, description="training goals")
    n_test_tasks: int = Field(5, ge=1, le=1000, description="held-out goals (never trained on)")
    episodes_per_quality: int = Field(50, ge=2, le=10_000, description="episodes per tier")
    horizon: int = Field(20, ge=2, le=500, description="steps per episode")
    data_seed: int = Field(0, ge=0, description="seed of the goals and the episodes")
    # model (paper §3; sizes of the small track)
    d_model: int = Field(64, ge=8, le=1024, description="width of every transformer")
    heads: int = Field(4, ge=1, le=16, description="attention heads")
    layers: int = Field(2, ge=1, le=24, description="behaviour-decoder layers")
    text_layers: int = Field(2, ge=1, le=24, description="character text-encoder layers")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout")
    context: int = Field(10, ge=1, le=200, description="K: steps in the decoder's window")
    prompt_len: int = Field(5, ge=1, le=200, description="prompt_dt: steps of the prompt")
    rtg_scale: float = Field(10.0, gt=0.0, description="return-to-go divisor")
    text_encoder: Literal["char", "minilm"] = Field(
        "char",
        description="char (a character-level transformer trained end to end) or minilm (frozen "
        "all-MiniLM-L6-v2 sentence embeddings and a trained projection: one memory token)",
    )
    # losses (paper §3: unit weights)
    w_dt: float = Field(1.0, ge=0.0, le=100.0, description="weight of L_DT")
    w_tbc: float = Field(1.0, ge=0.0, le=100.0, description="weight of L_TBC")
    w_tbm: float = Field(1.0, ge=0.0, le=100.0, description="weight of L_TBM")
    loss_balance: Literal["unit", "text_grad", "text_grad_running", "shared_grad_running"] = Field(
        "unit",
        description="unit (paper §3: w_tbc and w_tbm as given), text_grad (before the first "
        "step, each alignment loss's weight is multiplied by the ratio of L_DT's gradient norm "
        "on the text encoder to its own, the means over balance_batches training batches of "
        "the freshly initialised model: the alignment losses then pull on the text encoder "
        "as hard as the action loss) or text_grad_running (text_grad's measurement before the "
        "first step and again after every balance_every steps, each resetting the factors, so "
        "the balance holds through training) or shared_grad_running (text_grad_running's "
        "schedule; each factor is the smaller of the two ratios measured on the text encoder "
        "and on the decoder blocks, so no alignment loss pulls on either part the policy "
        "shares harder than L_DT)",
    )
    balance_batches: int = Field(
        5, ge=1, le=100, description="text_grad(_running): training batches of a measurement"
    )
    balance_every: int = Field(
        100,
        gt=0,
        le=1_000_000,
        description="text_grad_running, shared_grad_running: steps between re-measurements (after steps "
        "balance_every, 2 balance_every, ... of the run, counted from its first step)",
    )
    # optimisation
    lr: float = Field(3e-4, gt=0.0, le=1.0, description="AdamW learning rate")
    weight_decay: float = Field(1e-4, ge=0.0, le=1.0, description="AdamW weight decay")
    warmup: int = Field(100, ge=0, description="linear warm-up steps")
    grad_clip: float = Field(0.25, gt=0.0, description="gradient norm clip")
    tasks_per_step: int = Field(
        8, ge=2, le=1000, description="training tasks per step (DT and alignment batches)"
    )
    seqs_per_task: int = Field(8, ge=1, le=1000, description="windows per task per DT batch")
    # evaluation
    eval_episodes: int = Field(3, ge=1, le=100, description="episodes per held-out goal")
    start_jitter: float = Field(
        0.05, ge=0.0, le=0.5, description="start-state jitter of every episode after the first"
    )
    auc_episodes: int = Field(4, ge=1, le=1000, description="episodes per task for tbm_auc")
    share_k: int = Field(2, ge=1, le=50, description="data sharing: nearest training tasks")
    share_steps: int = Field(10, ge=1, le=100_000, description="data sharing: fine-tune steps")
    share_batch: int = Field(64, ge=1, le=4096, description="data sharing: batch")
    share_lr: float = Field(1e-4, gt=0.0, le=1.0, description="data sharing: AdamW rate")
    leak_factors: list[float] = Field(
        [0.5, 1.5], description="scalings of the description's return field (leak test)"
    )
    seeds: int = Field(3, ge=1, le=20, description="training seeds of the reproduction")
    minilm_row: bool = Field(
        False,
        description="the reproduction also trains TG-DT and the naive text DT on frozen "
        "MiniLM embeddings (the tgdt_minilm and naive_text_dt_minilm rows)",
    )
    rows: list[str] | None = Field(
        None,
        description="train only these rows of the reproduction (default: all), for a reported "
        "sub-run such as the MiniLM comparison; the tgdt row also gives its share and "
        "shuffled-text rows",
    )

    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={
            "lr": Float(1e-4, 1e-3, log=True),
            "d_model": Choice([32, 64, 96, 128]),  # widths every preset's heads divide
            "w_tbc": Float(0.1, 3.0, log=True),
            "w_tbm": Float(0.1, 3.0, log=True),
        },
        metric="loss",
        mode="min",
        curve=("loss", "dt"),
    )
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "eval_episodes", "start_jitter", "auc_episodes", "share_k", "share_steps",
        "share_batch", "share_lr", "leak_factors",
    }  # fmt: skip

    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": {
            "episodes_per_quality": 6, "d_model": 16, "heads": 2, "layers": 1,
            "text_layers": 1, "dropout": 0.0, "context": 5, "prompt_len": 3, "lr": 1e-3,
            "warmup": 0, "steps": 20, "tasks_per_step": 4, "seqs_per_task": 4,
            "eval_episodes": 1, "auc_episodes": 2, "share_k": 1,
            "share_steps": 2, "share_batch": 16, "seeds": 1, "log_every": 5,
            "checkpoint_every": 10,
        },
        # the next small (declared before its run, README "The next small"): 200 training and
        # 20 held-out goals (goals 0-199 train, 200-219 held out), 550 steps (warm-up 55: the
        # most that fits 30 minutes on 2 cores), the alignment losses balanced on the text
        # encoder and on the decoder blocks (the smaller factor) at initialisation and
        # re-balanced every 100 steps, no MiniLM rows; 3 seeds, every row. The small before it
        # (results/small-v3.* once this one is made) is `--set
        # loss_balance=text_grad_running`; the re-made small (results/small-v2.*) is `--set
        # steps=1000 --set warmup=100 --set loss_balance=text_grad --set minilm_row=true`; the
        # first small (45 / 5 goals, 500 steps, unit weights, no MiniLM rows;
        # results/small-v1.*) is `--set n_train_tasks=45 --set n_test_tasks=5 --set steps=500
        # --set warmup=50 --set loss_balance=unit` (its rows equal, the new tgdt_no_align row
        # added)
        "small": {
            "n_train_tasks": 200, "n_test_tasks": 20, "steps": 550, "warmup": 55,
            "loss_balance": "shared_grad_running", "balance_every": 100, "minilm_row": False,
            "log_every": 100, "checkpoint_every": 500,
        },
        # Meta-World ML1 reach: 40 training and 10 held-out goal positions (50 tasks, as
        # PointRobot's), 10 episodes per tier of 60 steps (~72k simulator steps to collect);
        # `small`'s model, the first small's 500 steps, 2 seeds (10 held-out tasks per seed:
        # 20 task rollouts against the first small's 15); the scripted expert's return is ~6
        # per step, so R̂ / 100
        "small-metaworld": {
            "env": "metaworld", "n_train_tasks": 40, "n_test_tasks": 10,
            "episodes_per_quality": 10, "horizon": 60, "rtg_scale": 100.0, "eval_episodes": 1,
            "steps": 500, "warmup": 50, "log_every": 50, "checkpoint_every": 250, "seeds": 2,
        },
        "paper": {
            "d_model": 128, "heads": 8, "layers": 12, "text_layers": 12, "context": 20,
            "prompt_len": 5, "lr": 1e-4, "warmup": 10_000, "steps": 50_000,
            "tasks_per_step": 45, "seqs_per_task": 16,
            "eval_episodes": 50, "share_batch": 256, "log_every": 100,
            "checkpoint_every": 5000,
        },
    }  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> TGDTConfig:
        if self.env == "metaworld" and self.mw_benchmark == "ML1":
            for name in ("n_train_tasks", "n_test_tasks"):
                if getattr(self, name) > MW_TASKS:
                    raise ValueError(f"field '{name}': Meta-World ML1 has {MW_TASKS} tasks on "
                                     "each side")  # fmt: skip
        if self.env == "metaworld" and self.mw_benchmark == "ML10":
            for name, classes in (("n_train_tasks", 10), ("n_test_tasks", 5)):
                n = getattr(self, name)
                if n % classes or n > classes * MW_TASKS:
                    raise ValueError(f"field '{name}': ML10 needs a multiple of {classes} (as "
                                     f"many tasks of each of its {classes} classes), at most "
                                     f"{classes * MW_TASKS}")  # fmt: skip
            if self.horizon > 500:
                raise ValueError("field 'horizon': Meta-World episodes last at most 500 steps")
        if self.d_model % self.heads:
            raise ValueError("field 'heads': must divide d_model")
        if self.context > self.horizon:
            raise ValueError(f"field 'context': {self.context} > horizon = {self.horizon}")
        if self.prompt_len > self.horizon:
            raise ValueError(f"field 'prompt_len': {self.prompt_len} > horizon = {self.horizon}")
        if self.tasks_per_step > self.n_train_tasks:
            raise ValueError(
                f"field 'tasks_per_step': {self.tasks_per_step} > n_train_tasks = "
                f"{self.n_train_tasks}"
            )
        if self.share_k > self.n_train_tasks:
            raise ValueError(f"field 'share_k': {self.share_k} > n_train_tasks")
        if not self.leak_factors or any(f <= 0 or f == 1 for f in self.leak_factors):
            raise ValueError("field 'leak_factors': positive scalings other than 1")
        return self

    @property
    def state_dim(self) -> int:
        return ENVS[self.env][0]

    @property
    def act_dim(self) -> int:
        return ENVS[self.env][1]

    @property
    def goal_dim(self) -> int:
        return ENVS[self.env][2]

    @property
    def max_action(self) -> float:
        return ENVS[self.env][3]

    @property
    def n_tasks(self) -> int:
        return self.n_train_tasks + self.n_test_tasks

    @property
    def uses_text(self) -> bool:
        return self.system in TEXT_SYSTEMS

    @property
    def cross(self) -> bool:
        """Whether the decoder cross-attends to the description's tokens."""
        return self.system in CROSS_SYSTEMS

    @property
    def balanced(self) -> bool:
        """Whether the alignment losses' weights are set from their gradients on the text
        encoder (at initialisation, and with a running balance again during training;
        shared_grad_running on the decoder blocks too)."""
        return self.loss_balance in BALANCED and (self.tbc or self.tbm)

    def rebalances_at(self, step: int) -> bool:
        """Whether training step ``step`` (1-based, global: a resumed run counts from the
        run's first step) starts by re-measuring the factors: the running balances
        (text_grad_running, shared_grad_running) after every ``balance_every`` steps, i.e.
        before steps balance_every + 1, 2 balance_every + 1, ... (the measurement before step
        1 is the one at initialisation)."""
        return (
            self.balanced
            and self.loss_balance in RUNNING
            and step > 1
            and (step - 1) % self.balance_every == 0
        )

    @property
    def tbc(self) -> bool:
        return self.system in ("tgdt", "tgdt_no_tbm") and self.w_tbc > 0

    @property
    def tbm(self) -> bool:
        return self.system in ("tgdt", "tgdt_no_tbc") and self.w_tbm > 0
