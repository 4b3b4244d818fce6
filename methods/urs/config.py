"""URS configuration and presets."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from nshot.method import MethodConfig

from .representation import parse_variant

SEEN_SMALL = ["TSP", "CVRP", "OVRP", "VRPTW", "VRPL", "VRPB"]
# every other combination of {O, B, L, TW}, the mixed-backhaul presets and multi-depot ones
UNSEEN_SMALL = [
    "OVRPTW", "OVRPL", "OVRPB", "VRPBTW", "VRPBL", "VRPLTW", "OVRPBTW", "OVRPBL", "OVRPLTW",
    "VRPBLTW", "OVRPBLTW", "VRPMB", "VRPMBTW", "OVRPMBL", "MDVRP", "MDVRPTW",
]  # fmt: skip
UNSEEN_ALL = UNSEEN_SMALL + [
    "OVRPMB", "VRPMBL", "OVRPMBTW", "VRPMBLTW", "OVRPMBLTW", "MDOVRP", "MDVRPB", "MDVRPL",
    "MDOVRPTW", "MDVRPLTW", "MDVRPMBTW",
]  # fmt: skip
# the paper's 11 seen variants are unknown; reconstruction: MTPOMO's 5 + TSP + 5 pairs
SEEN_PAPER = SEEN_SMALL[1:] + ["TSP", "OVRPTW", "VRPBL", "OVRPL", "VRPLTW", "VRPBTW"]


class URSConfig(MethodConfig):
    # ---- model
    arch: Literal["urs", "mtpomo"] = Field(
        "urs",
        description="'mtpomo': the MTPOMO baseline (POMO with attribute composition, "
        "mtpomo.py) instead of the URS network; d, layers, ff, heads and clip apply",
    )
    heads: int = Field(8, ge=1, le=64, description="attention heads (MTPOMO only)")
    d: int = Field(64, ge=4, le=2048, description="embedding width")
    layers: int = Field(3, ge=1, le=48, description="encoder layers")
    ff: int = Field(256, ge=4, le=16384, description="feed-forward width")
    clip: float = Field(50.0, gt=0.0, le=1000.0, description="logit clipping C")
    mbm: bool = Field(True, description="mixed bias module (False: geometric bias B_1 only)")
    generator: bool = Field(True, description="problem-conditioned parameter generator")
    encoding: Literal["udr", "flags"] = Field(
        "udr",
        description="'flags': problem enumeration by attribute flags instead of the UDR's "
        "global vector (the urs_flags row: URS's backbone, no MBM, no generator)",
    )
    gen_rank: int = Field(4, ge=1, le=64, description="rank of the generated weight deltas")
    gen_hidden: int = Field(64, ge=4, le=4096, description="generator MLP width")
    # ---- training (POMO REINFORCE)
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    lr_decay_at: float = Field(0.8, gt=0.0, le=1.0, description="×0.1 after this fraction")
    grad_clip: float = Field(1.0, gt=0.0)
    batch_size: int = Field(32, ge=1, le=65536, description="instances per step at train_sizes[0]")
    train_sizes: list[int] = Field(default_factory=lambda: [20], min_length=1)
    stage1_frac: float = Field(
        1.0, ge=0.0, le=1.0, description="fraction of steps at train_sizes[0] before sizes vary"
    )
    train_starts: int = Field(20, ge=1, le=4096, description="POMO rollouts per instance")
    seen_variants: list[str] = Field(default_factory=lambda: list(SEEN_SMALL), min_length=1)
    train_layouts: list[Literal["uniform", "clustered"]] = Field(
        default_factory=lambda: ["uniform"],
        min_length=1,
        description="customer layouts of the training instances, each instance's drawn "
        "uniformly among them ('clustered': Gaussian clusters, as the X benchmark's generator)",
    )
    val_instances: int = Field(16, ge=1, le=100_000, description="validation instances / report")
    # ---- evaluation / experiments
    unseen_variants: list[str] = Field(default_factory=lambda: list(UNSEEN_SMALL))
    clustered_variants: list[str] = Field(
        default_factory=list,
        description="variants also tested with customers in Gaussian clusters (test sets "
        "'<variant>@clustered', their own reference solutions and rows)",
    )
    eval_sizes: list[int] = Field(default_factory=lambda: [50, 100], min_length=1)
    eval_instances: int = Field(8, ge=1, le=100_000, description="test instances per variant/size")
    eval_starts: int = Field(100, ge=1, le=4096, description="max POMO starts at inference")
    augment: int = Field(8, description="symmetric augmentations at inference (1 or 8)")
    eval_batch: int = Field(8, ge=1, le=4096, description="instances decoded together")
    ref_time_per_node: float = Field(
        0.02, gt=0.0, le=60.0, description="reference solver seconds per customer"
    )
    ref_time_min: float = Field(0.2, gt=0.0, le=3600.0)
    systems: list[
        Literal[
            "urs", "urs_no_mbm", "urs_no_generator", "mtpomo", "urs_flags", "urs_clustered_train"
        ]
    ] = Field(default_factory=lambda: ["urs", "urs_no_mbm", "urs_no_generator"], min_length=1)
    scaling_sizes: list[int] = Field(default_factory=lambda: [50, 100, 200, 500, 1000])
    test_seed: int = Field(
        10_000, ge=0, description="seed of the test sets (distinct from training)"
    )
    experiment_seeds: int = Field(
        1,
        ge=1,
        le=20,
        description="training seeds per trained system in experiments() (seed, seed + 1, ...); "
        "the heuristics and the reference are deterministic and run once",
    )

    # `nshot eval --set` may change these (the test sets (sizes, instances, zero-shot variants),
    # decoding and the reference solver's time); every other field is fixed by the checkpoint, since
    # it shapes the model
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "eval_sizes",
        "eval_instances",
        "eval_starts",
        "augment",
        "eval_batch",
        "unseen_variants",
        "clustered_variants",
        "ref_time_per_node",
        "ref_time_min",
    }
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": dict(
            d=16, layers=1, ff=32, gen_rank=2, gen_hidden=16, batch_size=4, train_sizes=[10],
            train_starts=10, steps=20, log_every=10, checkpoint_every=10, lr=1e-4,
            seen_variants=["CVRP", "VRPTW"], unseen_variants=["OVRPBLTW", "VRPMB", "MDVRPTW"],
            eval_sizes=[10], eval_instances=2, eval_starts=10, augment=1, val_instances=4,
            ref_time_min=0.1, ref_time_per_node=0.01, scaling_sizes=[10, 20],
        ),
        "small": dict(
            d=64, layers=3, ff=256, gen_rank=4, batch_size=32, train_sizes=[20],
            train_starts=20, steps=1000, log_every=100, checkpoint_every=250, lr=5e-4,
            seen_variants=SEEN_SMALL, unseen_variants=UNSEEN_SMALL, eval_sizes=[20, 50],
            eval_instances=8, eval_starts=50, augment=8, clustered_variants=["CVRP", "VRPTW"],
            systems=["urs", "urs_no_mbm", "urs_no_generator", "mtpomo"],
            experiment_seeds=3,  # the headline's paired test over training seeds
        ),
        "paper": dict(
            d=128, layers=12, ff=512, gen_rank=4, gen_hidden=256, batch_size=128,
            train_sizes=[100, 500], stage1_frac=0.5, train_starts=100, steps=1_000_000,
            log_every=1000, checkpoint_every=10_000, lr=1e-4, seen_variants=SEEN_PAPER,
            unseen_variants=[v for v in UNSEEN_ALL if v not in SEEN_PAPER],
            eval_sizes=[100], eval_instances=1000, eval_starts=100, augment=8, eval_batch=64,
            ref_time_per_node=0.1, systems=["urs", "urs_no_mbm", "urs_no_generator", "mtpomo"],
            scaling_sizes=[100, 200, 500, 1000, 2000, 5000, 7000],
        ),
    }  # fmt: skip

    @field_validator("seen_variants", "unseen_variants", "clustered_variants")
    @classmethod
    def _variants(cls, v: list[str]) -> list[str]:
        for name in v:
            parse_variant(name)  # raises ValueError naming the variant
        return v

    @field_validator("train_sizes", "eval_sizes", "scaling_sizes")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        for n in v:
            if not 2 <= n <= 10_000:
                raise ValueError(f"size {n} outside [2, 10000]")
        return v

    @model_validator(mode="after")
    def _check(self) -> URSConfig:
        if self.augment not in (1, 8):
            raise ValueError("field 'augment': must be 1 or 8")
        if self.arch == "mtpomo" and self.d % self.heads:
            raise ValueError(f"field 'heads': d = {self.d} is not a multiple of {self.heads}")
        if any(parse_variant(v).num_depots > 1 for v in self.seen_variants):
            raise ValueError("field 'seen_variants': multi-depot variants are test-only")
        return self
