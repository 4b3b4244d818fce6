"""Keystone predictor: greedy generation from the base or keystone-SFT model, with optional
interventions on the keystone neurons.

The model is loaded on the checkpoint config's ``device`` (default ``auto``) unless
``from_checkpoint`` is given another; the Δ rows, masks and token ids follow the model's device.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.nn.lm import model_device, pad_token_id
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .config import KeystoneConfig
from .neurons import DeltaRows, NeuronHooks, NeuronSpace
from .probe import module_matched_set


class Intervention(StrictRequest):
    mode: Literal["none", "zero_keystone", "zero_random", "scale_keystone"] = "none"
    scale: float | None = Field(
        None, ge=0.0, le=10.0, description="factor r for scale_keystone (0-10)"
    )
    seed: int = Field(0, ge=0, description="draw of the random set for zero_random")

    @model_validator(mode="after")
    def _check(self) -> Intervention:
        if self.mode == "scale_keystone" and self.scale is None:
            raise ValueError("scale: required for mode 'scale_keystone'")
        if self.mode != "scale_keystone" and self.scale is not None:
            raise ValueError(f"scale: only used by mode 'scale_keystone', not {self.mode!r}")
        return self


class KeystoneRequest(StrictRequest):
    prompt: str = Field(..., min_length=1, description="text to continue")
    max_new_tokens: int = Field(32, ge=1, le=256)
    intervention: Intervention = Field(default_factory=Intervention)

    @model_validator(mode="after")
    def _check(self) -> KeystoneRequest:
        if not self.prompt.strip():
            raise ValueError("prompt: is empty")
        return self


class KeystoneResponse(BaseModel):
    completion: str
    neurons_affected: int
    model: Literal["base", "keystone_sft"]


class KeystonePredictor(Predictor[KeystoneRequest, KeystoneResponse]):
    Request = KeystoneRequest
    Response = KeystoneResponse

    def __init__(
        self,
        model,
        tok,
        cfg: KeystoneConfig,
        keystones: list[dict[str, Any]],
        delta_state: dict[str, torch.Tensor] | None = None,
        source: str | None = None,
    ) -> None:
        self.model, self.tok, self.cfg = model.eval(), tok, cfg
        self.space = NeuronSpace(model, cfg.modules)
        self.keystones = keystones
        self.gids = [self.space.gid(k["layer"], k["module"], k["index"]) for k in keystones]
        self.delta: DeltaRows | None = None
        if delta_state:
            self.delta = DeltaRows(self.space, self.gids)
            self.delta.load_state_dict(delta_state)
        self.source = source or cfg.model
        self.context = int(getattr(model.config, "max_position_embeddings", 2048))

    @classmethod
    def from_checkpoint(
        cls, checkpoint: LoadedCheckpoint, device: str | None = None
    ) -> KeystonePredictor:
        """The checkpoint's model (with its Δ rows, if any) on ``device`` (a device setting;
        default: the checkpoint config's ``device``)."""
        from .model import load_model

        cfg = KeystoneConfig.validated(checkpoint.config)
        extra = checkpoint.extra
        source = extra.get("model_source", cfg.model)
        model, tok = load_model(source, cfg, device)
        space = NeuronSpace(model, cfg.modules)
        if extra.get("space", {}).get("total") not in (None, space.total):
            raise ValueError(
                f"checkpoint {checkpoint.path}: recorded {extra['space']['total']} neurons, "
                f"model {source!r} has {space.total}"
            )
        weights = checkpoint.weights()
        delta = {k.removeprefix("delta."): v for k, v in weights.items() if k.startswith("delta.")}
        return cls(model, tok, cfg, extra.get("keystones", []), delta or None, source)

    def metadata(self) -> dict[str, Any]:
        return {
            "model_source": self.source,
            "model": "keystone_sft" if self.delta is not None else "base",
            "keystones": self.keystones,
            "n_keystones": len(self.keystones),
            "total_neurons": self.space.total,
            "space": self.space.describe(),
            "context": self.context,
        }

    def example_request(self) -> dict[str, Any]:
        """An addition prompt of the model's capability suite with the keystones zeroed (a
        few greedy tokens)."""
        tiny = self.cfg.suite(self.source) == "tiny"
        prompt = "3 + 4 =" if tiny else "2 + 2 = 4\n3 + 5 = 8\n4 + 3 ="
        return {"prompt": prompt, "max_new_tokens": 3, "intervention": {"mode": "zero_keystone"}}

    def _scale(self, iv: Intervention) -> dict[int, float]:
        if iv.mode == "zero_keystone":
            return dict.fromkeys(self.gids, 0.0)
        if iv.mode == "scale_keystone":
            return dict.fromkeys(self.gids, float(iv.scale))
        if iv.mode == "zero_random":
            rng = np.random.default_rng([iv.seed, 3])
            return dict.fromkeys(module_matched_set(self.space, self.gids, rng), 0.0)
        return {}

    @torch.no_grad()
    def __call__(self, request: KeystoneRequest) -> KeystoneResponse:
        from .evaluation import encode

        ids = encode(self.tok, request.prompt)
        if len(ids) + request.max_new_tokens > self.context:
            raise ValueError(
                f"prompt: {len(ids)} tokens + max_new_tokens {request.max_new_tokens} exceed "
                f"the model's context of {self.context} tokens"
            )
        unk = getattr(self.tok, "unk_token_id", None)
        if unk is not None and unk in ids:
            bad = [i for i, t in enumerate(ids) if t == unk]
            raise ValueError(f"prompt: tokens at positions {bad} are outside the vocabulary")
        scale = self._scale(request.intervention)
        hooks = NeuronHooks(self.space, scale=scale or None, delta=self.delta)
        x = torch.tensor([ids], device=model_device(self.model))
        with hooks:
            out = self.model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=request.max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=pad_token_id(self.tok),
            )
        text = self.tok.decode(out[0, x.shape[1] :], skip_special_tokens=True)
        return KeystoneResponse(
            completion=text,
            neurons_affected=len(scale),
            model="keystone_sft" if self.delta is not None else "base",
        )
