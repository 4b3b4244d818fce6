"""ReCoG configuration and presets.

``small`` follows the paper's setting at CPU scale: an ECFP-MLP molecule encoder in place of the
pretrained GIN (``encoder="gin"`` in ``paper``), first-order episodic training instead of MAML,
10 auxiliaries sampled per episode plus the injected distractors.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Float, Int, TuneSpec

VERSION = "1"  # of the checkpoint format

Track = Literal["moleculeace", "synthetic"]
System = Literal[
    "recog",
    "context_graph",
    "recog_no_cpr",
    "recog_no_cgib",
    "protonet",
    "recog_shuffled_context",
]


class RecogConfig(MethodConfig):
    # what `nshot train recog` trains
    system: System = Field(
        "recog",
        description="recog (CPR + CGIB), context_graph (neither), recog_no_cpr, recog_no_cgib, "
        "protonet (fingerprint encoder, prototypes) or recog_shuffled_context (auxiliary label "
        "vectors permuted across molecules)",
    )
    track: Track = Field(
        "moleculeace",
        description="moleculeace: 30 ChEMBL targets with real labels (22 train / 8 test); "
        "synthetic: RDKit's shipped molecules with generated properties (offline fallback)",
    )
    fetch_data: bool = Field(
        False, description="fetch the pinned MoleculeACE wheel from the package index if absent"
    )
    active_pact: float = Field(
        7.0, ge=3.0, le=11.0, description="active when pAct = y + 9 >= this (y = -log10 nM)"
    )
    split_seed: int = Field(0, ge=0, description="seed of the train/test target split")
    n_test_targets: int = Field(8, ge=1, le=20, description="held-out target properties")
    min_shared: int = Field(
        30, ge=0, description="each test target shares >= this many molecules with a train one"
    )
    synthetic_pool: int = Field(
        0, ge=0, description="molecules of the synthetic track (0: all of RDKit's ~12,000)"
    )
    flip_rate: float = Field(0.05, ge=0.0, le=0.5, description="synthetic label flips")
    hide_rate: float = Field(0.2, ge=0.0, lt=1.0, description="synthetic labels hidden (NaN)")
    n_distractors: int = Field(10, ge=0, le=50, description="random-label auxiliaries injected")
    distractor_identity: Literal["fixed", "fresh"] = Field(
        "fixed",
        description="fixed: the distractors keep their own property embeddings in every episode "
        "(a gate can learn their identities); fresh: each episode gives them the embeddings of "
        "informative properties it did not choose, so only their labels can give them away",
    )
    # model
    encoder: Literal["ecfp_mlp", "gin"] = Field("ecfp_mlp", description="molecule encoder")
    fp_bits: int = Field(1024, ge=64, le=4096, description="ECFP4 bits (ecfp_mlp encoder)")
    gin_layers: int = Field(5, ge=1, le=10, description="GIN layers (gin encoder)")
    d: int = Field(128, ge=4, le=1024, description="hidden width")
    layers: int = Field(2, ge=1, le=6, description="context-graph message-passing layers")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    readout: Literal["query", "support"] = Field(
        "query",
        description="query: logit = MLP([h_query; h_t]); support: plus s · (cos(h_query, "
        "positive prototype) − cos(h_query, negative prototype)) over the support molecules' "
        "final graph states (s learned), so the answer reads the labelled support directly",
    )
    nan_w: float = Field(0.5, ge=0.0, le=1.0, description="weight of unlabelled (NaN) edges")
    n_aux: int = Field(10, ge=1, le=200, description="informative auxiliaries per episode")
    lambda_rel: float = Field(0.1, ge=0.0, description="weight of the relation loss (CPR)")
    rel_frac: float = Field(0.2, gt=0.0, lt=1.0, description="auxiliary edges hidden for L_rel")
    beta: float = Field(0.05, ge=0.0, description="weight of the information bottleneck")
    r0: float = Field(0.5, gt=0.0, lt=1.0, description="prior keep rate of the bottleneck")
    tau: float = Field(0.5, gt=0.0, description="Gumbel temperature")
    # episodes and optimisation
    shots: list[int] = Field([1, 10], min_length=1, description="k per class (train and eval)")
    query: int = Field(16, ge=1, le=1000, description="queries per training episode")
    lr: float = Field(1e-3, gt=0.0, le=1.0, description="Adam learning rate")
    weight_decay: float = Field(5e-5, ge=0.0, le=1.0)
    # evaluation
    eval_draws: int = Field(10, ge=1, le=1000, description="support draws per test target")
    eval_queries: int = Field(256, ge=4, le=100_000, description="query cap per draw")
    val_every: int = Field(100, ge=1, description="validation AUC every N episodes")
    seeds: int = Field(5, ge=1, le=20, description="seeds of the reproduction")
    synthetic_seeds: int = Field(3, ge=1, le=20, description="seeds of the synthetic track")
    synthetic_steps: int = Field(
        500, ge=1, description="training episodes per model on the synthetic track"
    )
    exp_tracks: list[Track] = Field(
        ["moleculeace", "synthetic"], min_length=1, description="tracks `experiments` runs"
    )

    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={
            "lr": Float(1e-4, 3e-3, log=True),
            "beta": Float(0.005, 0.2, log=True),
            "lambda_rel": Float(0.01, 0.5, log=True),
            "layers": Int(1, 3),
        },
        metric="val_auc",
        mode="max",
        curve=("val_auc", "loss"),
    )
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "eval_draws",
        "eval_queries",
        "fetch_data",
    }

    # A step is one training episode.
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": {
            "track": "synthetic", "synthetic_pool": 600, "d": 32, "layers": 1, "dropout": 0.0,
            "n_aux": 4, "n_distractors": 4, "shots": [1], "query": 4, "steps": 20,
            "log_every": 5, "checkpoint_every": 10, "val_every": 10, "eval_draws": 2,
            "eval_queries": 16, "seeds": 1, "n_test_targets": 4, "exp_tracks": ["synthetic"],
            "synthetic_seeds": 1, "synthetic_steps": 20,
        },
        # the support read-out, fresh distractor identities, 3,000 episodes on 3 seeds (the
        # earlier 1,000-episode recipe on 5 seeds is results/small-v1)
        "small": {
            "fetch_data": True, "d": 64, "steps": 3000, "log_every": 100,
            "checkpoint_every": 1000, "val_every": 500, "synthetic_steps": 500, "seeds": 3,
            "readout": "support", "distractor_identity": "fresh",
        },
        "paper": {
            "fetch_data": True, "encoder": "gin", "d": 300, "n_aux": 50, "steps": 5000,
            "readout": "support", "distractor_identity": "fresh",
            "synthetic_seeds": 10, "synthetic_steps": 2000,
            "eval_draws": 20, "eval_queries": 100_000, "seeds": 10, "log_every": 100,
            "checkpoint_every": 500, "val_every": 100,
        },
    }  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> RecogConfig:
        if any(k < 1 or k > 64 for k in self.shots):
            raise ValueError("field 'shots': each k must lie in [1, 64]")
        if self.checkpoint_every % self.log_every and self.checkpoint_every < self.steps:
            raise ValueError("field 'checkpoint_every': must be a multiple of log_every")
        return self
