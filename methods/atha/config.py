"""ATHA configuration and presets.

``smoke`` / ``small`` use nshot's own tiny CLIP (:mod:`nshot.train.clip`, the preset of the same
name: ``small`` with the frozen MiniLM text tower, ``smoke`` with the word tower); ``paper`` is
CLIP ViT-B/16 read by path with ``transformers``' CLIP (``clip_path``: a Hugging Face folder or
an OpenAI-format safetensors file) on target domains in image folders (``data_path``), for a
GPU (the paper's setting: 800 / 400 episodes of 100 epochs; :mod:`.paper_data`). The two differ
in the backbone (:meth:`AthaConfig.backbone_spec`) and the data, not in the method's code.

A step of ``nshot train atha`` is one step of the tiny CLIP's contrastive pre-training; the
episodes (adaptation on a support set, classification of its queries) run in ``evaluate``,
``experiments`` and the predictor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Float, TuneSpec

if TYPE_CHECKING:
    from nshot.nn.backbone import BackboneSpec

VERSION = "1"  # of the checkpoint format

Domain = Literal["textured", "sketch", "digits", "mnist", "textile"]
System = Literal[
    "atha",
    "coop_lora",
    "coop",
    "clip_lora",
    "zero_shot",
    "atha_head_only",
    "atha_tail_only",
    "random_tokens",
    "tail_fixed",
]
SYSTEMS: tuple[str, ...] = (
    "atha",
    "coop_lora",
    "coop",
    "clip_lora",
    "zero_shot",
    "atha_head_only",
    "atha_tail_only",
    "random_tokens",
)
#: the experiments of ``nshot reproduce atha`` (``experiment``): the main comparison, and the
#: fixed-rho- sweep of the tail push alone against CoOp + LoRA (:func:`sweep_row`)
Experiment = Literal["comparison", "tail_sweep"]


def sweep_row(rho_minus: float) -> str:
    """The row of the tail sweep at ``rho_minus``: ``tail_rho0p4`` for 0.4 (a name the claim
    language reads as a system)."""
    return "tail_rho" + f"{rho_minus:g}".replace(".", "p").replace("-", "m")


class AthaConfig(MethodConfig):
    # the backbone
    backbone: Literal["tiny", "clip"] = Field(
        "tiny",
        description="tiny: nshot's tiny CLIP, pre-trained by `nshot train atha` (or taken from "
        "the cache); clip: a real CLIP read from clip_path (paper preset, a GPU)",
    )
    clip_preset: Literal["smoke", "small", "small-cls", "small-cls-ln", "small-cls-ln-glyphs"] = (
        Field(
            "small-cls-ln-glyphs",
            description="the tiny CLIP preset (nshot.train.clip.PRESETS): small-cls-ln-glyphs "
            "(recipe 9, the default since its pilot met the README's rule: recipe 8 whose "
            "source adds printed numerals captioned with their words and line drawings of the "
            "shapes), small-cls-ln (recipe 8: recipe 7 with CLIP's "
            "text-feature scale, the MiniLM embedding entering the projection with ln_final's "
            "norm), small-cls (recipe 7, the class token and a joint space narrower than the "
            "width, as CLIP's head) or small (recipe 6, mean-pooled, a square projection)",
        )
    )
    text: Literal["word", "minilm"] = Field(
        "minilm", description="the tiny CLIP's text tower: word (no extra) or frozen MiniLM"
    )
    clip_workers: int = Field(
        2,
        ge=0,
        le=64,
        description="Ray Train workers that pre-train the tiny CLIP for experiments when the "
        "cache lacks it (0: in this process); the weights depend on it, so each count is "
        "cached apart",
    )
    clip_path: str | None = Field(
        None, description="a Hugging Face CLIP folder or OpenAI-format .safetensors (backbone=clip)"
    )
    clip_tokenizer: str | None = Field(
        None,
        description="CLIP BPE tokenizer files (a folder, or bpe_simple_vocab_16e6.txt.gz) for an "
        "OpenAI-format clip_path; default: the files beside it",
    )
    clip_arch: str = Field(
        "ViT-B-16", description="the architecture clip_path must have (ViT-B-16, ViT-B-32, any)"
    )
    data_path: str | None = Field(
        None, description="target domains for backbone=clip: <domain>/<class>/ image folders"
    )
    data_domains: list[str] = Field(
        [], description="domain folders of data_path to run (default: every one)"
    )
    # ATHA (paper §3; the authors' options txtlayer, add_ratio, minus_ratio)
    txtlayer: int = Field(
        4,
        ge=0,
        le=47,
        description="text block whose output makes the anchors (0-based; MiniLM has 6)",
    )
    rho_block: int = Field(2, ge=0, le=47, description="visual block whose rho+ starts non-zero")
    rho_plus_init: float = Field(0.8, ge=0.0, le=10.0, description="initial rho+ of rho_block")
    rho_minus_init: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description="initial rho- of rho_block (the same block as rho+), for the systems with "
        "a tail push (atha, atha_tail_only, random_tokens: learnable from it; tail_fixed: held "
        "at it); 0, the authors' initialisation, leaves the tail push off until rho- learns",
    )
    add_ratio: float = Field(0.3, ge=0.0, le=1.0, description="share of head tokens")
    minus_ratio: float = Field(0.2, ge=0.0, le=1.0, description="share of tail tokens")
    use_all_texts: bool = Field(
        False, description="softmax(tau * S) mix of anchors instead of argmax / argmin"
    )
    tau: float = Field(0.1, gt=0.0, le=100.0, description="temperature of use_all_texts")
    # CoOp + CLIP-LoRA (paper §4.1)
    n_ctx: int = Field(4, ge=1, le=16, description="learnable context vectors")
    ctx_init: str = Field("a photo of a", description="words the context starts from")
    lora_r: int = Field(4, ge=1, le=64, description="LoRA rank")
    lora_alpha: float = Field(4.0, gt=0.0, description="LoRA alpha (scaling alpha / sqrt(r))")
    lora_dropout: float = Field(0.25, ge=0.0, lt=1.0, description="dropout on the LoRA input")
    lr_lora: float = Field(1e-3, gt=0.0, le=1.0, description="AdamW learning rate of LoRA")
    lr_ctx: float = Field(2e-3, gt=0.0, le=10.0, description="SGD learning rate of the context")
    lr_ctx_logit_scale: float | None = Field(
        None,
        gt=0.0,
        le=1000.0,
        description="the logit scale lr_ctx was set for: the context's SGD step is then lr_ctx "
        "x lr_ctx_logit_scale / s, s the episode's logit scale (scale_1shot, scale_kshot), "
        "since the gradient reaching the context is proportional to s (small: 100, CLIP's "
        "scale, for which CoOp's 2e-3 was set: 0.1 at 1 shot, 0.05 at 5); None: lr_ctx as "
        "is (the authors', at s = 2 and 4)",
    )
    lr_rates: float = Field(1e-3, gt=0.0, le=10.0, description="SGD learning rate of rho")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum (context, rates)")
    sgd_weight_decay: float = Field(5e-4, ge=0.0, le=1.0, description="SGD weight decay")
    scale_1shot: float = Field(2.0, gt=0.0, le=100.0, description="logit scale at 1 shot")
    scale_kshot: float = Field(4.0, gt=0.0, le=100.0, description="logit scale above 1 shot")
    epochs: int = Field(20, ge=1, le=1000, description="full-support steps per episode")
    max_epochs: int = Field(100, ge=1, le=1000, description="the predictor's cap on epochs")
    # episodes
    n_way: int = Field(5, ge=2, le=20, description="classes per episode")
    queries: int = Field(15, ge=1, le=100, description="queries per class")
    pool_per_class: int = Field(60, ge=16, le=1000, description="images per class and domain")
    domains: list[Domain] = Field(
        ["textured", "sketch", "digits"],
        min_length=1,
        description="target domains (mnist: the larger drop-in variant of digits; textile: "
        "conformal-clip-data's grey fabric images, 3 classes, so its episodes are at most "
        "3-way; needs that package)",
    )
    episodes_1shot: int = Field(30, ge=1, le=10_000, description="1-shot episodes per domain")
    episodes_5shot: int = Field(30, ge=0, le=10_000, description="5-shot episodes per domain")
    systems: list[System] = Field(list(SYSTEMS), min_length=1, description="rows to run")
    systems_5shot: list[System] = Field(
        ["atha", "coop_lora"], description="rows also run at 5 shots"
    )
    seeds: int = Field(
        1,
        ge=1,
        le=20,
        description="training seeds of the tiny-CLIP reproduction (seed, seed + 1, ...): each "
        "adapts the tiny CLIP clip_seed names (per_seed: pre-trains its own) and draws its own "
        "pools, episodes and LoRA initialisations; rows are means over seeds and the claims' "
        "samples are per seed (one seed: per episode); the paper preset runs one real CLIP, so "
        "one seed",
    )
    clip_seed: Annotated[int, Field(ge=0)] | Literal["per_seed"] = Field(
        0,
        description="the pre-training seed of the tiny CLIP the episodes adapt (clip_seed_for): "
        "an int, the one tiny CLIP pre-trained with that seed, which every training seed "
        "adapts (cached once; the paper's setting, one pre-trained CLIP whose adaptation the "
        "seeds vary); per_seed: training seed s adapts the tiny CLIP pre-trained with seed s. "
        "nshot train atha pre-trains the same CLIP; the training seed still draws the pools, "
        "episodes and LoRA / context initialisations. backbone=clip (paper) reads the one "
        "real CLIP of clip_path: clip_seed does not matter there",
    )
    experiment: Experiment = Field(
        "comparison",
        description="comparison: the eight systems (the claims' main results); tail_sweep: "
        "zero-shot, CoOp + LoRA and the tail push alone at each fixed rho- of "
        "sweep_rho_minus (system tail_fixed), sweep_episodes 1-shot episodes per domain and "
        "seed, paired over (seed, episode) (results small-tail_sweep.json)",
    )
    sweep_rho_minus: list[float] = Field(
        [0.2, 0.4, 0.8],
        min_length=1,
        description="experiment=tail_sweep: the fixed rho- of rho_block, one row each "
        "(tail_rho0p2, ...)",
    )
    sweep_episodes: int = Field(
        30,
        ge=1,
        le=10_000,
        description="experiment=tail_sweep: 1-shot episodes per domain and seed",
    )
    eval_episodes: int = Field(10, ge=1, le=10_000, description="episodes per domain (evaluate)")
    episodes_per_job: int = Field(10, ge=1, le=10_000, description="episodes per Ray task")
    job_gpus: float = Field(
        0.0, ge=0.0, le=8.0,
        description="GPUs each task of the paper reproduction reserves (Ray; a fraction shares "
        "a GPU; 0 on a CPU-only cluster)",
    )  # fmt: skip

    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={
            "add_ratio": Float(0.1, 0.5),
            "minus_ratio": Float(0.05, 0.4),
            "rho_plus_init": Float(0.0, 1.5),
            "lr_lora": Float(1e-4, 3e-3, log=True),
        },
        metric="acc_1shot_avg",
        mode="max",
        curve=("acc_1shot_avg", "loss"),
    )
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "eval_episodes",
        "epochs",
        "domains",
        "add_ratio",
        "minus_ratio",
        "rho_plus_init",
        "rho_minus_init",
        "rho_block",
        "txtlayer",
        "lr_lora",
        "lr_ctx",
        "lr_ctx_logit_scale",
        "lr_rates",
        "use_all_texts",
        "tau",
    }

    # A step is one pre-training step of the tiny CLIP (nshot.train.clip.PRESETS[clip_preset]).
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": {
            "clip_preset": "smoke", "text": "word", "clip_workers": 0, "steps": 60,
            "checkpoint_every": 20, "log_every": 20, "txtlayer": 0, "rho_block": 1,
            "lora_r": 2, "lora_alpha": 2.83, "lora_dropout": 0.0, "epochs": 2, "max_epochs": 10,
            "episodes_1shot": 2, "episodes_5shot": 1, "queries": 3, "pool_per_class": 16,
            "eval_episodes": 1, "episodes_per_job": 2,
        },
        # 30 / 30 episodes per domain trimmed to 20 / 15 (an episode step costs ~80 ms of CPU:
        # MiniLM's BERT runs the prompts for CoOp + LoRA), then to 10 / 5 so that a cold cache
        # (pre-training included) fits the 15-minute budget; the episodes are the first 10 / 5
        # of the 20 / 15. Three training seeds (three tiny CLIPs, each with its own episodes)
        # so that the headline's paired test has three per-seed values: about three times one
        # seed's ~8 minutes on two free cores. The context learns at CoOp's learning rate
        # carried to ATHA's logit scale (lr_ctx_logit_scale: 2e-3 x 100 / s; at the authors'
        # 2e-3 and s = 2 CoOp's answers stayed zero-shot's), the same for every row that
        # learns a context, at no cost in time
        "small": {"steps": 1500, "checkpoint_every": 300, "log_every": 25,
                  "episodes_1shot": 10, "episodes_5shot": 5, "seeds": 3,
                  "lr_ctx_logit_scale": 100.0},
        "paper": {
            "backbone": "clip", "txtlayer": 10, "rho_block": 6, "lora_r": 16,
            "lora_alpha": 8.0, "lr_lora": 2e-4, "epochs": 100, "episodes_1shot": 800,
            "episodes_5shot": 400, "steps": 1, "checkpoint_every": 1, "log_every": 1,
            "pool_per_class": 200, "eval_episodes": 100, "episodes_per_job": 20,
            "job_gpus": 1.0,
        },
    }  # fmt: skip

    def backbone_spec(self, seed: int | None = None) -> BackboneSpec:
        """The backbone this config names (:mod:`nshot.nn.backbone`): the tiny CLIP of
        ``clip_preset`` / ``text`` that training seed ``seed`` (default: the config's) adapts,
        pre-trained with :func:`clip_seed_for`'s seed on ``clip_workers`` workers and cached
        (``tiny``), or the real CLIP at ``clip_path`` (``clip``; ``clip_seed`` unused)."""
        from nshot.nn.backbone import BackboneSpec

        if self.backbone == "clip":
            return BackboneSpec("hfclip", {"clip_path": self.clip_path,
                                           "clip_tokenizer": self.clip_tokenizer,
                                           "clip_arch": self.clip_arch})  # fmt: skip
        return BackboneSpec("tinyclip", {
            "preset": self.clip_preset, "text": self.text,
            "seed": clip_seed_for(self, seed), "workers": self.clip_workers,
        })  # fmt: skip

    @field_validator("clip_seed", mode="before")
    @classmethod
    def _check_clip_seed(cls, value: Any) -> Any:
        """A non-negative int (not a bool, not a numeral in a string) or ``'per_seed'``."""
        if value == "per_seed" or (
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
        ):
            return value
        raise ValueError(f"a non-negative int or 'per_seed' (got {value!r})")

    @model_validator(mode="after")
    def _check(self) -> AthaConfig:
        if self.add_ratio + self.minus_ratio > 1.0:
            raise ValueError(
                "field 'minus_ratio': add_ratio + minus_ratio must be <= 1 "
                f"(got {self.add_ratio} + {self.minus_ratio})"
            )
        if len(set(self.domains)) != len(self.domains):
            raise ValueError("field 'domains': a domain is listed twice")
        if not set(self.systems_5shot) <= set(self.systems):
            raise ValueError("field 'systems_5shot': every system must also be in systems")
        if self.n_way > 8 and any(d in ("textured", "sketch") for d in self.domains):
            raise ValueError("field 'n_way': the shape domains have 8 classes")
        if self.queries + 10 > self.pool_per_class:
            raise ValueError("field 'pool_per_class': must hold 10 shots + queries per class")
        if any(not 0.0 <= v <= 10.0 for v in self.sweep_rho_minus):
            raise ValueError("field 'sweep_rho_minus': each rho- must lie in [0, 10]")
        if len({sweep_row(v) for v in self.sweep_rho_minus}) != len(self.sweep_rho_minus):
            raise ValueError("field 'sweep_rho_minus': a value is listed twice")
        if self.epochs > self.max_epochs:
            raise ValueError("field 'epochs': must be <= max_epochs")
        if self.backbone == "tiny" and (self.clip_path is not None or self.data_path):
            raise ValueError("field 'clip_path': clip_path and data_path are for backbone=clip")
        if self.backbone == "clip" and self.seeds > 1:
            raise ValueError(
                "field 'seeds': backbone=clip runs the one real CLIP of clip_path (one seed; "
                "its episodes are the paired units)"
            )
        return self


def clip_seed_for(cfg: AthaConfig, seed: int | None = None) -> int:
    """The pre-training seed of the tiny CLIP that training seed ``seed`` (default: the
    config's ``seed``) adapts: ``clip_seed``, the same for every training seed, or with
    ``clip_seed='per_seed'`` the training seed itself."""
    if isinstance(cfg.clip_seed, int):
        return cfg.clip_seed
    return cfg.seed if seed is None else seed  # per_seed
