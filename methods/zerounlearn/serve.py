"""ZeroUnlearn's predictor: greedy generation from the edited model.

The checkpoint holds only the edited down_proj weights; the base model is loaded from the
recorded source and checked against the recorded fingerprint before the weights are applied.
Metadata never reveals the forgotten facts. The model is loaded on the checkpoint config's
``device`` (default ``auto``) unless ``from_checkpoint`` is given another; requests are batched
on the model's device.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, Field, field_validator

from nshot.method import Predictor
from nshot.nn.lm import encode, model_device, pad_token_id
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import CheckpointError, LoadedCheckpoint

from .config import ZeroUnlearnConfig
from .edit import EditRequest, load_edited_weights, model_fingerprint, neutral_id


class ZeroUnlearnRequest(StrictRequest):
    prompt: str = Field(..., description="text to continue")
    max_new_tokens: int = Field(8, ge=1, le=64)
    top_k: int = Field(5, ge=1, le=50, description="next-token alternatives returned")

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("prompt is empty or whitespace only")
        return v


class TokenProb(BaseModel):
    token: str
    prob: float


class ZeroUnlearnResponse(BaseModel):
    completion: str
    next_token_top_k: list[TokenProb]
    neutral: bool = Field(..., description="the first generated token is the neutral target")
    edited_layers: list[int]


class ZeroUnlearnPredictor(Predictor[ZeroUnlearnRequest, ZeroUnlearnResponse]):
    Request = ZeroUnlearnRequest
    Response = ZeroUnlearnResponse

    def __init__(
        self,
        model: Any,
        tok: Any,
        edited_layers: list[int],
        meta: dict[str, Any],
        example_prompt: str = "The capital of France is",
    ) -> None:
        self.model = model.eval()
        self.tok = tok
        self.edited_layers = edited_layers
        self.meta = meta
        self.example_prompt = example_prompt
        self.window = int(getattr(model.config, "max_position_embeddings", 2048))

    @classmethod
    def from_checkpoint(
        cls, checkpoint: LoadedCheckpoint, device: str | None = None
    ) -> ZeroUnlearnPredictor:
        """The edited model of ``checkpoint`` on ``device`` (a device setting; default: the
        checkpoint config's ``device``)."""
        from .pipeline import load_model

        cfg = ZeroUnlearnConfig.validated(checkpoint.config)
        extra = checkpoint.extra
        model, tok = load_model(cfg, device)
        want = extra.get("model_fingerprint")
        if want and model_fingerprint(model, model.config.num_hidden_layers - 1) != want:
            raise CheckpointError(
                f"checkpoint {checkpoint.path}: the base model {cfg.model!r} differs from the one "
                "that was edited (fingerprint mismatch)"
            )
        layers = load_edited_weights(model, checkpoint.weights())
        meta = {
            "model": cfg.model,
            "n_forgotten": len(extra.get("forget", [])),
            "neutral_target": extra.get("neutral_target", tok.eos_token),
            "seed": cfg.seed,
            "variant": cfg.variant,
            "edited_layers": layers,
            "context_window": int(getattr(model.config, "max_position_embeddings", 2048)),
        }
        retained = extra.get("retain") or []
        example = (
            EditRequest.from_json(retained[0]).prompt() if retained else "The capital of France is"
        )
        return cls(model, tok, layers, meta, example)

    def metadata(self) -> dict[str, Any]:
        return dict(self.meta)

    def example_request(self) -> dict[str, Any]:
        """The prompt of a fact the edit kept (never a forgotten one), three greedy tokens."""
        return {"prompt": self.example_prompt, "max_new_tokens": 3, "top_k": 3}

    def __call__(self, request: ZeroUnlearnRequest) -> ZeroUnlearnResponse:
        return self.batch([request])[0]

    @torch.no_grad()
    def batch(self, requests: list[ZeroUnlearnRequest]) -> list[ZeroUnlearnResponse]:
        """Greedy decoding of all prompts together (left-padded, one KV cache)."""
        encoded = []
        for r in requests:
            ids = encode(self.tok, r.prompt)
            if len(ids) + r.max_new_tokens > self.window:
                raise ValueError(
                    f"prompt: {len(ids)} tokens + max_new_tokens {r.max_new_tokens} exceed the "
                    f"context window of {self.window} tokens"
                )
            encoded.append(ids)
        steps = max(r.max_new_tokens for r in requests)
        width = max(len(e) for e in encoded)
        pad = pad_token_id(self.tok)
        ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, e in enumerate(encoded):
            ids[i, width - len(e) :] = torch.tensor(e)
            mask[i, width - len(e) :] = 1
        dev = model_device(self.model)
        ids, mask = ids.to(dev), mask.to(dev)
        eos = neutral_id(self.tok)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos,
            output_scores=True,
            return_dict_in_generate=True,
        )
        first = torch.softmax(out.scores[0].float(), -1)
        gen = out.sequences[:, width:]
        responses = []
        for i, r in enumerate(requests):
            toks = gen[i, : r.max_new_tokens].tolist()
            if eos in toks:
                toks = toks[: toks.index(eos)]
            top = first[i].topk(r.top_k)
            responses.append(
                ZeroUnlearnResponse(
                    completion=self.tok.decode(toks, skip_special_tokens=True),
                    next_token_top_k=[
                        TokenProb(token=self.tok.decode([int(t)]), prob=float(p))
                        for p, t in zip(top.values, top.indices)
                    ],
                    neutral=int(gen[i, 0]) == eos,
                    edited_layers=list(self.edited_layers),
                )
            )
        return responses
