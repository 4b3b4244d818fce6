"""BSR configuration and presets.

Everything EEG-specific (bands, frame layout, the generated motor-imagery data, the protocols) is
a reconstruction from the paper's abstract; the VideoMAE parts follow VideoMAE's recipe (tube
masking, per-patch normalised targets, AdamW β = (0.9, 0.95), lr = base · B_ref / 256 with B_ref
the total batch of VideoMAE's runs, warm-up then cosine, layer-wise lr decay and a warm-up in
fine-tuning). ``small`` is the CPU scale, ``paper`` the ViT-B scale of VideoMAE.

The generated EEG has two declared versions (``generator_version``): 1, stationary trials whose
class is a static band-power map (4 s); 2 (the default), cue-locked motor-imagery trials with
event-related desynchronisation and the β rebound (6 s: 1 s before the cue, 3 s of imagery, the
rebound after it). ``--set generator_version=1 --set trial_s=4`` makes version 1's data again.

Each fine-tuned or fitted row takes its own recipe (learning rate and layer decay, a
regularisation strength, a CNN's learning rate) from a declared grid, chosen by the same
validation budget on ``select_subjects`` source subjects (``experiments.RECIPE_GRIDS``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Float, Int, TuneSpec

if TYPE_CHECKING:
    from nshot.nn.backbone import BackboneSpec

VERSION = "1"  # of the checkpoint format

System = Literal[
    "bsr",
    "bsr_linear_probe",
    "videomae_scratch",
    "bandpower_lr",
    "bandpower_frames_lr",
    "riemann_ts_lr",
    "eegnet",
    "topomap_cnn",
    "bsr_scrambled_positions",
]
# the fields that shape the generated EEG (the cache key of the data is their hash)
DATA_FIELDS = (
    "data_seed", "sfreq", "trial_s", "source_spacing_mm", "n_source_subjects",
    "n_source_trials", "n_target_subjects", "n_target_trials", "suppression", "alpha_boost",
    "background_rel", "sensor_noise_rel",
)  # fmt: skip
# version 2's fields on top (version 1's key is the fields above alone, as before the versions)
DATA_FIELDS_V2 = (
    "generator_version", "cue_s", "imagery_s", "erd_latency_s", "latency_jitter_s",
    "beta_rebound",
)  # fmt: skip


# the fields that shape VideoMAE (the options of the backbone spec; ``model.vmae_config``)
ARCH_FIELDS = (
    "grid", "patch", "frames", "tubelet", "width", "depth", "heads", "dec_width", "dec_depth",
    "dec_heads",
)  # fmt: skip

# the fields that shape the eegbci trials (dataset eegbci: the cache key of the data)
EEGBCI_FIELDS = (
    "dataset", "sfreq", "trial_s", "n_source_subjects", "n_source_trials", "n_target_subjects",
    "n_target_trials", "data_seed",
)  # fmt: skip


class BsrConfig(MethodConfig):
    dataset: Literal["simulated", "eegbci"] = Field(
        "simulated",
        description="simulated (the generator below; offline) or eegbci: PhysioNet's EEG Motor "
        "Movement/Imagery recordings (64 channels, 160 Hz; imagined left hand, right hand, "
        "feet and rest), read from data_path or, with fetch_data, downloaded",
    )
    data_path: str | None = Field(
        None,
        description="dataset eegbci: the folder of the EDF files (PhysioNet's layout "
        "S001/S001R04.edf, or MNE's MNE-eegbci-data/files/eegmmidb/1.0.0/ below it)",
    )
    fetch_data: bool = Field(
        False,
        description="dataset eegbci without data_path: download the runs needed from PhysioNet "
        "into $NSHOT_CACHE/eegbci (MNE's downloader; checksums from MNE)",
    )
    # --- the generated EEG (paper §4 protocol, reconstructed; see the README's Data section)
    generator_version: Literal[1, 2] = Field(
        2,
        description="the generated EEG: 1, stationary trials (the class a static band-power "
        "map; trial_s 4 then); 2, cue-locked motor imagery: μ/β desynchronisation after the "
        "cue, β rebound after the imagery, subject-level latency jitter",
    )
    data_seed: int = Field(0, ge=0, description="seed of the EEG generator (subjects, trials)")
    sfreq: float = Field(128.0, ge=64.0, le=1024.0, description="sampling rate of the data (Hz)")
    trial_s: float = Field(
        6.0, gt=0.0, le=30.0,
        description="trial length (s); version 2: cue_s before the cue, the imagery, the rebound",
    )  # fmt: skip
    cue_s: float = Field(
        1.0, ge=0.0, le=30.0, description="version 2: time of the cue in the trial (s)"
    )
    imagery_s: float = Field(
        3.0, gt=0.0, le=30.0, description="version 2: imagery period after the cue (s)"
    )
    erd_latency_s: float = Field(
        0.5, ge=0.0, le=3.0,
        description="version 2: mean delay of the desynchronisation's onset (and of its end) "
        "after the cue (after the imagery's end), s",
    )  # fmt: skip
    latency_jitter_s: float = Field(
        0.15, ge=0.0, le=1.0, description="version 2: subject-level s.d. of that latency (s)"
    )
    beta_rebound: float = Field(
        0.5, ge=0.0, le=5.0,
        description="version 2: β power above baseline at the post-imagery rebound's peak, over "
        "the area that desynchronised (0.5: +50 %)",
    )  # fmt: skip
    source_spacing_mm: float = Field(
        15.0, ge=5.0, le=40.0, description="grid spacing of the volume source space (mm)"
    )
    n_source_subjects: int = Field(20, ge=1, le=500, description="pretraining subjects")
    n_source_trials: int = Field(
        80, ge=4, le=5000, description="trials per source subject (a multiple of 4 classes)"
    )
    n_target_subjects: int = Field(10, ge=1, le=200, description="held-out target subjects")
    n_target_trials: int = Field(
        40, ge=2, le=1000, description="labelled trials per class per target subject"
    )
    suppression: float = Field(
        0.4, ge=0.0, lt=1.0, description="μ/β power drop over the moving limb's motor area"
    )
    alpha_boost: float = Field(0.3, ge=0.0, le=5.0, description="posterior α rise at rest")
    background_rel: float = Field(
        1.0, ge=0.0, le=100.0, description="1/f background RMS relative to the rhythms' RMS"
    )
    sensor_noise_rel: float = Field(
        0.3, ge=0.0, le=100.0, description="white sensor noise RMS relative to the rhythms' RMS"
    )
    # --- rendering (paper §3, reconstructed)
    grid: int = Field(32, ge=8, le=512, description="side H = W of the rendered scalp grid")
    frames: int = Field(16, ge=2, le=64, description="frames F of a spectrum video")
    window_s: float = Field(0.5, gt=0.0, le=10.0, description="spectral window per frame (s)")
    # --- VideoMAE
    patch: int = Field(8, ge=1, le=64, description="spatial patch side p")
    tubelet: int = Field(2, ge=1, le=8, description="frames per tubelet")
    width: int = Field(128, ge=8, le=2048, description="encoder width")
    depth: int = Field(4, ge=1, le=48, description="encoder blocks")
    heads: int = Field(4, ge=1, le=64, description="encoder attention heads")
    dec_width: int = Field(64, ge=8, le=2048, description="decoder width")
    dec_depth: int = Field(2, ge=1, le=24, description="decoder blocks")
    dec_heads: int = Field(2, ge=1, le=64, description="decoder attention heads")
    mask_ratio: float = Field(0.9, gt=0.0, lt=1.0, description="tube-mask ratio")
    # --- stage 1: masked pretraining (a step is one batch)
    batch: int = Field(32, ge=1, le=4096, description="pretraining batch")
    base_lr: float = Field(
        1.5e-4, gt=0.0, le=1.0, description="peak lr = base_lr · lr_ref_batch / 256"
    )
    lr_ref_batch: int = Field(
        1024, ge=1, le=65_536,
        description="total batch at which VideoMAE's lr rule is evaluated (its ViT-S recipe: "
        "32 GPUs × 32); the peak lr does not shrink with our smaller batch",
    )  # fmt: skip
    min_lr: float = Field(1e-5, ge=0.0, le=1.0, description="end of the cosine schedule")
    warmup_steps: int = Field(150, ge=0, description="linear warm-up steps")
    weight_decay: float = Field(0.05, ge=0.0, le=1.0)
    val_frac: float = Field(0.1, gt=0.0, lt=0.5, description="source clips held out for mae_mse")
    backbone: Literal["videomae-scratch", "videomae"] = Field(
        "videomae-scratch",
        description="what masked pretraining starts from (nshot.nn.backbone): videomae-scratch, "
        "VideoMAE of the fields above randomly initialised (seed); videomae, the video "
        "foundation model at init_weights (preset paper; default when init_weights is given)",
    )  # fmt: skip
    init_weights: str | None = Field(
        None,
        description="backbone videomae: the VideoMAE checkpoint on disk masked pretraining "
        "starts from (the paper's video foundation model, e.g. Kinetics-400 VideoMAE-Base): a "
        "Hugging Face folder with model.safetensors, or the file; the encoder must fit the "
        "config (preset paper fits VideoMAE-Base), the decoder is loaded when present; never a "
        "pickle",
    )  # fmt: skip
    mae_references: bool = Field(
        False,
        description="`nshot reproduce`: also fit ridge regressions from 1, 2 and 4 visible "
        "patches to the masked targets (what the visible patches determine linearly; "
        "extra.mae_references; a few CPU-minutes)",
    )  # fmt: skip
    # --- stage 2: few-shot fine-tuning
    ft_epochs: int = Field(30, ge=1, le=1000, description="fine-tuning epochs on the support")
    ft_base_lr: float = Field(
        5e-4, gt=0.0, le=1.0, description="peak lr = ft_base_lr · ft_lr_ref_batch / 256"
    )
    ft_lr_ref_batch: int = Field(
        384, ge=1, le=65_536,
        description="total batch of VideoMAE's ViT-S fine-tuning recipe (32 GPUs × 12)",
    )  # fmt: skip
    ft_warmup_epochs: int = Field(5, ge=0, le=1000, description="linear warm-up, then cosine")
    ft_batch: int = Field(8, ge=1, le=1024, description="fine-tuning batch")
    layer_decay: float = Field(0.75, gt=0.0, le=1.0, description="layer-wise lr decay")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0)
    lr_c: float = Field(
        1.0, gt=0.0, le=1e6,
        description="inverse L2 strength of the logistic regressions (band power, Riemann, the "
        "linear probe and the predictor's probe)",
    )  # fmt: skip
    topomap_lr: float = Field(3e-3, gt=0.0, le=1.0, description="topomap CNN's learning rate")
    select_subjects: int = Field(
        2, ge=0, le=500,
        description="source subjects on which each row's recipe is chosen from its grid (k = "
        "select_shots, montage A, one support draw); 0: every row keeps the config's recipe",
    )  # fmt: skip
    select_shots: int = Field(5, ge=1, le=1000, description="k per class of the recipe choice")
    head_pool: Literal["mean", "position"] = Field(
        "mean",
        description="the read-out of the encoder's last block for the fine-tuning head and the "
        "probe: mean (VideoMAE's: the mean over every token) or position (the "
        "time-mean of each in-head spatial token, concatenated: a deviation that keeps where on "
        "the scalp a feature sits)",
    )
    # --- protocol
    shots: list[int] = Field([1, 5, 10], min_length=1, description="k per class")
    eval_subjects: int = Field(6, ge=1, le=200, description="target subjects evaluated")
    seeds: int = Field(2, ge=1, le=20, description="support draws (seeds) per subject")
    systems: list[System] = Field(
        ["bsr", "bsr_linear_probe", "videomae_scratch", "bandpower_lr", "bandpower_frames_lr",
         "riemann_ts_lr", "eegnet", "topomap_cnn", "bsr_scrambled_positions"],
        min_length=1, description="rows `experiments` runs",
    )  # fmt: skip
    eegnet_epochs: int = Field(20, ge=1, le=1000, description="EEGNet source-training epochs")
    eegnet_ft_epochs: int = Field(20, ge=1, le=1000, description="EEGNet epochs on the support")
    topomap_epochs: int = Field(60, ge=1, le=1000, description="topomap CNN epochs on the support")

    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={
            "base_lr": Float(5e-5, 1e-3, log=True),
            "mask_ratio": Float(0.5, 0.9),
            "weight_decay": Float(0.01, 0.1, log=True),
            "depth": Int(2, 6),
        },
        metric="val_mae_mse",
        mode="min",
        curve=("val_mae_mse", "loss"),
    )
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "shots", "eval_subjects", "seeds", "ft_epochs", "ft_base_lr", "ft_lr_ref_batch",
        "ft_warmup_epochs", "ft_batch", "layer_decay", "label_smoothing", "head_pool", "lr_c",
        "topomap_lr", "select_subjects", "select_shots",
    }  # fmt: skip

    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": {
            "trial_s": 2.0, "n_source_subjects": 3, "n_source_trials": 8,
            "n_target_subjects": 2, "n_target_trials": 6, "grid": 16, "frames": 8,
            "width": 32, "depth": 1, "heads": 2, "dec_width": 16, "dec_depth": 1,
            "dec_heads": 1, "mask_ratio": 0.75, "batch": 8, "base_lr": 1e-3,
            "lr_ref_batch": 256, "warmup_steps": 0, "steps": 4, "log_every": 2,
            "checkpoint_every": 2, "ft_epochs": 2, "ft_warmup_epochs": 0, "shots": [1, 5],
            "eval_subjects": 1, "seeds": 1, "eegnet_epochs": 1, "eegnet_ft_epochs": 2,
            "topomap_epochs": 5, "select_subjects": 1, "select_shots": 1,
        },
        # pretraining the planned 30 epochs of the 1,440 training clips at batch 32; 4 target
        # subjects x 3 training seeds (support draws and fine-tuning), the planned 3 seeds, so
        # that the headline's paired test has three seeds; each row's recipe chosen on 2
        # source subjects (README, Budget)
        "small": {
            "steps": 1350, "log_every": 50, "checkpoint_every": 450, "ft_epochs": 20,
            "eval_subjects": 4, "seeds": 3, "eegnet_epochs": 10,
        },
        "paper": {
            "grid": 224, "patch": 16, "width": 768, "depth": 12, "heads": 12, "dec_width": 384,
            "dec_depth": 4, "dec_heads": 6, "steps": 40_000, "warmup_steps": 2000,
            "batch": 64, "lr_ref_batch": 2048, "ft_epochs": 100, "eval_subjects": 10,
            "seeds": 3, "log_every": 100, "checkpoint_every": 2000, "backbone": "videomae",
        },
    }  # fmt: skip

    @property
    def samples(self) -> int:
        """Samples per trial at ``sfreq``."""
        return int(round(self.trial_s * self.sfreq))

    @property
    def window(self) -> int:
        """Samples per spectral window at ``sfreq``."""
        return int(round(self.window_s * self.sfreq))

    @property
    def spatial_patches(self) -> int:
        return (self.grid // self.patch) ** 2

    @property
    def n_masked(self) -> int:
        """Masked spatial patches per clip: ``floor(ratio · S)``, leaving at least one visible
        at every ratio below 1 (VideoMAE cannot reshape an empty visible set): 0.9 of the
        smoke grid's 4 patches masks 3."""
        return min(self.spatial_patches - 1, math.floor(self.mask_ratio * self.spatial_patches))

    def data_key(self) -> dict:
        if self.dataset == "eegbci":
            fields = EEGBCI_FIELDS
        elif self.generator_version == 1:
            fields = DATA_FIELDS
        else:
            fields = DATA_FIELDS + DATA_FIELDS_V2
        return {k: getattr(self, k) for k in fields}

    def backbone_spec(self) -> BackboneSpec:
        """The backbone this config names (:mod:`nshot.nn.backbone`; its kinds are registered
        by :mod:`.model`): VideoMAE of the ``ARCH_FIELDS`` randomly initialised with ``seed``
        (``videomae-scratch``), or the VideoMAE checkpoint at ``init_weights`` read into it
        (``videomae``)."""
        from nshot.nn.backbone import BackboneSpec

        options: dict[str, Any] = {f: getattr(self, f) for f in ARCH_FIELDS}
        options["seed"] = self.seed
        if self.backbone == "videomae":
            options["init_weights"] = self.init_weights
        return BackboneSpec(self.backbone, options)

    @model_validator(mode="before")
    @classmethod
    def _backbone_of_init_weights(cls, data: Any) -> Any:
        """``init_weights`` without a ``backbone`` names ``videomae`` (``--set init_weights=``
        on any preset, and the configs of checkpoints written before the field)."""
        if isinstance(data, dict) and data.get("init_weights") and "backbone" not in data:
            data = {**data, "backbone": "videomae"}
        return data

    @model_validator(mode="after")
    def _check(self) -> BsrConfig:
        if self.backbone == "videomae-scratch" and self.init_weights is not None:
            raise ValueError(
                "field 'init_weights': backbone videomae-scratch starts from random weights; "
                "set backbone=videomae to start from init_weights"
            )
        if self.grid % self.patch:
            raise ValueError("field 'patch': must divide grid")
        if self.frames % self.tubelet:
            raise ValueError("field 'tubelet': must divide frames")
        if self.spatial_patches < 2:
            raise ValueError("field 'patch': the grid needs at least 2 spatial patches")
        s = self.spatial_patches
        if math.floor(self.mask_ratio * s) < 1:
            raise ValueError("field 'mask_ratio': masks no patch at this grid and patch")
        if self.width % self.heads:
            raise ValueError("field 'heads': must divide width")
        if self.dec_width % self.dec_heads:
            raise ValueError("field 'dec_heads': must divide dec_width")
        if self.n_source_trials % 4:
            raise ValueError("field 'n_source_trials': must be a multiple of the 4 classes")
        if self.window < 16 or self.sfreq / self.window > 4.0:
            raise ValueError("field 'window_s': the θ band (4-8 Hz) needs a window >= 0.25 s")
        if self.window > self.samples:
            raise ValueError("field 'window_s': longer than the trial")
        if self.ft_warmup_epochs >= self.ft_epochs and self.ft_warmup_epochs:
            raise ValueError("field 'ft_warmup_epochs': must be shorter than ft_epochs")
        if self.select_subjects > self.n_source_subjects:
            raise ValueError("field 'select_subjects': more than n_source_subjects")
        if self.select_subjects and self.select_shots >= self.n_source_trials // 4:
            raise ValueError(
                "field 'select_shots': a source subject has n_source_trials / 4 trials per "
                "class; k must leave a query"
            )
        if self.eval_subjects > self.n_target_subjects:
            raise ValueError("field 'eval_subjects': more than n_target_subjects")
        if any(k < 1 or k >= self.n_target_trials for k in self.shots):
            raise ValueError("field 'shots': each k must lie in [1, n_target_trials - 1]")
        if self.dataset == "eegbci" and self.trial_s > 4.0:
            raise ValueError(
                "field 'trial_s': an eegbci trial starts at its cue, and PhysioNet's task and "
                "rest periods last about 4 s, so a longer trial reaches into the next cue: set "
                "trial_s to at most 4 (the generator's version 2 default is 6)"
            )
        if self.dataset == "eegbci" and self.data_path is None and not self.fetch_data:
            raise ValueError(
                "field 'data_path': dataset eegbci reads PhysioNet's EDF files: give data_path "
                "(a folder holding S001/S001R04.edf, ...) or set fetch_data=true to download them"
            )
        if self.checkpoint_every % self.log_every and self.checkpoint_every < self.steps:
            raise ValueError("field 'checkpoint_every': must be a multiple of log_every")
        return self
