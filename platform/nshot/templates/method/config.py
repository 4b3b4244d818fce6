"""skeleton's configuration and presets.

Every field is validated (pydantic): an unknown field or a value out of range is one error
naming the field, before anything runs. Every method has the presets ``smoke`` (seconds: the
tests and the conformance checks train it), ``small`` (minutes on a laptop: the committed
results) and ``paper`` (the paper's scale).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Float, Int, TuneSpec


class SkeletonConfig(MethodConfig):
    # the data (data.py): generated classes, a few informative features among noisy ones
    dim: int = Field(16, ge=2, le=1024, description="features per example")
    signal_dims: int = Field(4, ge=1, le=1024, description="features that carry the class")
    noise: float = Field(2.0, ge=0.0, le=100.0, description="std of the other features")
    train_classes: int = Field(64, ge=2, le=10_000, description="classes to train on")
    test_classes: int = Field(16, ge=2, le=10_000, description="held-out classes")
    per_class: int = Field(20, ge=2, le=10_000, description="examples per class")
    data_seed: int = Field(0, ge=0, description="seed of the generated dataset")
    # the model (model.py)
    hidden: int = Field(64, ge=1, le=4096, description="width of the embedding's hidden layer")
    embed: int = Field(16, ge=1, le=1024, description="embedding width")
    # episodes: N-way K-shot with Q queries per class
    ways: int = Field(5, ge=2, le=100)
    shots: int = Field(5, ge=1, le=100)
    queries: int = Field(5, ge=1, le=100)
    # optimisation (train.py)
    lr: float = Field(1e-3, gt=0.0, le=1.0, description="Adam's learning rate")
    batch_episodes: int = Field(8, ge=1, le=1024, description="episodes per step")
    # evaluation and the comparison (experiments.py)
    eval_episodes: int = Field(200, ge=1, le=100_000, description="test episodes per system")
    experiment_seeds: int = Field(3, ge=1, le=100, description="training seeds compared")

    # `nshot eval --set` may change these; every other field shapes the checkpoint's model
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {"eval_episodes"}
    # what `nshot tune` sweeps by default, and the train-loop metric it maximises
    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={"lr": Float(1e-4, 1e-2, log=True), "hidden": Int(16, 128)},
        metric="episode_acc",
        mode="max",
    )
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": {
            "steps": 20,
            "log_every": 5,
            "checkpoint_every": 10,
            "eval_episodes": 20,
            "experiment_seeds": 2,
        },
        "small": {
            "steps": 300,
            "log_every": 50,
            "checkpoint_every": 100,
            "eval_episodes": 200,
            "experiment_seeds": 3,
        },
        "paper": {
            "steps": 2000,
            "log_every": 100,
            "checkpoint_every": 500,
            "eval_episodes": 1000,
            "experiment_seeds": 5,
        },
    }

    @model_validator(mode="after")
    def _fits(self) -> SkeletonConfig:
        if self.signal_dims > self.dim:
            raise ValueError(f"field 'signal_dims': at most dim = {self.dim}")
        if self.ways > min(self.train_classes, self.test_classes):
            raise ValueError("field 'ways': at most train_classes and test_classes")
        if self.shots + self.queries > self.per_class:
            raise ValueError(f"field 'shots': shots + queries at most per_class = {self.per_class}")
        return self
