"""Keystone configuration and presets (the paper's settings scaled to a 2-core CPU).

Preset decision: ``small`` probes the real SmolLM2-135M-Instruct (the probe, its controls and calibration; three disjoint
prompt groups, whose keystone sets are the headline's replicates) and runs the keystone SFT
comparison (the `sft_*` claims) on the same model (25 steps of batch 8, three seeds: what 2 CPU cores
allow, see the README); ``smoke`` runs
everything on ``tiny-smoke`` in seconds; ``paper`` probes any local or hub model
(``model=<path or hub name>``, ``allow_download=true``) with the paper's prompt budget.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.nn.lm import DeviceSpec
from nshot.train.deepspeed import DeepSpeedOptions

from .neurons import ALL_MODULES, DEFAULT_MODULES


class KeystoneConfig(MethodConfig):
    # model
    model: str = Field(
        "smollm2",
        description="'smollm2', 'tiny-smoke', 'tiny-small', a local HF folder or a hub name",
    )
    allow_download: bool = Field(False, description="let a hub name be downloaded")
    device: DeviceSpec = Field(
        "auto",
        description="where the model, the probe, the evaluations and SFT run: 'auto' (the "
        "current GPU when CUDA is available, else the CPU), 'cpu', 'cuda', 'cuda:N' (SFT "
        "under DeepSpeed uses the engine's device)",
    )
    modules: list[str] = Field(
        list(DEFAULT_MODULES), min_length=1, description=f"neuron modules, from {ALL_MODULES}"
    )
    # stage 1
    prompts: Literal["auto", "natural", "tiny"] = Field(
        "auto", description="probe prompt set; auto: 'tiny' for tiny-* models, else 'natural'"
    )
    chat: Literal["auto", "yes", "no"] = Field(
        "auto",
        description="wrap probe prompts in the chat template (auto: if the tokenizer has one)",
    )
    probe_tokens: int = Field(64, ge=2, le=4096, description="greedy tokens generated per prompt")
    rho: float = Field(0.02, gt=0.0, le=1.0, description="top fraction per block")
    # stage 2
    mask_grid: list[int] = Field(
        [1, 2, 5, 10, 20, 30, 50, 90, 150, 250, 400, 690], min_length=1, description="prefix sizes"
    )
    max_fraction: float = Field(0.005, gt=0.0, le=1.0, description="largest K* / all neurons")
    collapse_acc: float = Field(0.1, ge=0.0, le=1.0, description="collapse: acc <= this x base")
    collapse_ppl: float = Field(10.0, ge=1.0, description="collapse: ppl >= this x base")
    # evaluation
    eval_suite: Literal["auto", "natural", "tiny"] = Field("auto")
    eval_items: int = Field(32, ge=1, le=10_000, description="items kept per capability")
    eval_candidates: int = Field(120, ge=1, le=10_000, description="natural suite candidates")
    ppl_texts: int = Field(16, ge=0, le=10_000, description="held-out docstring paragraphs")
    ppl_tokens: int = Field(64, ge=8, le=4096)
    eval_batch: int = Field(32, ge=1, le=4096)
    # controls, calibration, stability
    control_draws: int = Field(
        5, ge=1, le=100, description="random draws of the module-matched control (check 1)"
    )
    extra_control_draws: int = Field(
        2, ge=1, le=100, description="draws of the uniform and same-layer random controls"
    )
    calib_grid: list[float] = Field(
        [0.5, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0], min_length=1, description="scales r"
    )
    stability_groups: int = Field(2, ge=1, le=5, description="disjoint prompt groups")
    # keystone SFT (the `sft_*` claims)
    sft: bool = Field(True, description="run the SFT comparison in experiments()")
    sft_model: str = Field("tiny-small", description="model the SFT comparison runs on")
    sft_steps: int = Field(300, ge=1, le=1_000_000)
    sft_batch: int = Field(32, ge=1, le=4096)
    sft_lr_keystone: float = Field(1e-3, gt=0.0, le=1.0)
    sft_lr_full: float = Field(1e-4, gt=0.0, le=1.0)
    sft_eval_every: int = Field(100, ge=1, description="log the SFT loss every N steps")
    sft_seeds: int = Field(3, ge=1, le=20)
    sft_eval_items: int = Field(
        100, ge=1, le=10_000, description="items per capability when judging forgetting"
    )
    sft_keystones: int = Field(
        0, ge=0, description="rows for SFT when the SFT model does not collapse (0: its K*)"
    )
    deepspeed: DeepSpeedOptions = Field(default_factory=DeepSpeedOptions)
    # what train_loop does
    train_sft: bool = Field(
        False, description="train_loop: after probing, fine-tune the keystone rows of `model`"
    )

    # `nshot eval --set` may change these (where the model runs and the evaluation suite); every
    # other field is fixed by the checkpoint, since it shapes the model
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "device",
        "eval_suite",
        "eval_items",
        "eval_candidates",
        "ppl_texts",
        "ppl_tokens",
        "eval_batch",
    }
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": dict(
            model="tiny-smoke", sft_model="tiny-smoke", probe_tokens=8, rho=0.1,
            mask_grid=[1, 2, 4, 8], max_fraction=0.05, eval_items=16, ppl_texts=4,
            ppl_tokens=32, control_draws=1, calib_grid=[0.5, 2.0], stability_groups=2,
            sft_steps=5, sft_batch=8, sft_eval_every=5, sft_seeds=1, steps=1,
        ),
        "small": dict(
            model="smollm2", sft_model="smollm2", probe_tokens=64, rho=0.02,
            mask_grid=[1, 2, 5, 10, 20, 30, 50, 90, 150, 250, 400, 690], max_fraction=0.005,
            eval_items=32, eval_candidates=120, ppl_texts=16, ppl_tokens=64, control_draws=5,
            stability_groups=3, sft_steps=25, sft_batch=8, sft_lr_full=1e-4,
            sft_lr_keystone=1e-3, sft_eval_every=5, sft_seeds=3, steps=1, torch_threads=2,
        ),
        "paper": dict(
            model="HuggingFaceTB/SmolLM2-360M-Instruct", allow_download=True, probe_tokens=256,
            rho=0.01, mask_grid=[1, 2, 5, 10, 20, 30, 50, 90, 150, 250, 400, 700, 1000, 2000],
            max_fraction=0.005, eval_items=100, eval_candidates=400, ppl_texts=64,
            ppl_tokens=256, control_draws=5, stability_groups=5, sft_steps=1000, sft_seeds=3,
            steps=1,
        ),
    }  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> KeystoneConfig:
        bad = [m for m in self.modules if m not in ALL_MODULES]
        if bad:
            raise ValueError(f"field 'modules': unknown {bad}; choose from {list(ALL_MODULES)}")
        if len(set(self.modules)) != len(self.modules):
            raise ValueError("field 'modules': a module is listed twice")
        if any(n < 1 for n in self.mask_grid):
            raise ValueError("field 'mask_grid': sizes must be >= 1")
        if any(not 0.0 <= r <= 10.0 for r in self.calib_grid):
            raise ValueError("field 'calib_grid': scales must lie in [0, 10]")
        if self.fail_at_step is not None and self.fail_at_step != 1:
            raise ValueError(
                f"field 'fail_at_step': {self.fail_at_step}, but the train loop has one step "
                "(the probe, then the optional keystone SFT, reported as step 1): only 1 can fail"
            )
        return self

    def is_tiny(self, model: str | None = None) -> bool:
        return (model or self.model).startswith("tiny-")

    def prompt_kind(self, model: str | None = None) -> str:
        if self.prompts != "auto":
            return self.prompts
        return "tiny" if self.is_tiny(model) else "natural"

    def suite(self, model: str | None = None) -> str:
        if self.eval_suite != "auto":
            return self.eval_suite
        return "tiny" if self.is_tiny(model) else "natural"

    def use_chat(self, tok) -> bool:
        if self.chat != "auto":
            return self.chat == "yes"
        return bool(getattr(tok, "chat_template", None))
