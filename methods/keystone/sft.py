"""Keystone-only SFT and its baselines: full fine-tuning and random-rows SFT.

Keystone SFT trains only the incoming rows ``W[j, :]`` of the keystone neurons, as a row-sparse
:class:`~.neurons.DeltaRows` added by forward hooks (``out[..., idx] += x @ Δᵀ``); the base
weights are frozen and only Δ is handed to the optimiser, so weight decay, Adam state and ZeRO
partitioning touch nothing else. (The ``row+col`` variant, which also trains the consuming columns, is not implemented.)
Every variant trains through the platform's DeepSpeed helper
(:func:`nshot.train.deepspeed.build_engine`), fp32 on CPU. The loss is token cross-entropy on
the response tokens only (answer + EOS); the vocabulary projection is applied to those positions
only (:class:`ResponseLoss`: the same loss as the model's own shifted cross-entropy; on
SmolLM2-135M the 49,152 × 576 output projection is a fifth of the weights, and the prompts are
~3× longer than the responses: 11 vs 3.9 tokens).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nshot.nn.lm import pad_token_id
from nshot.train.trainer import Recipe
from nshot.train.trainer import train as run_recipe

from .evaluation import encode_pair
from .neurons import DeltaRows, NeuronHooks, NeuronSpace


class DeltaModel(nn.Module):
    """A frozen causal LM plus trainable Δ rows applied by persistent forward hooks."""

    def __init__(self, lm: nn.Module, space: NeuronSpace, gids: Sequence[int]) -> None:
        super().__init__()
        self.lm = lm
        self.delta = DeltaRows(space, gids)
        for p in self.lm.parameters():
            p.requires_grad_(False)
        self._hooks = NeuronHooks(space, delta=self.delta).__enter__()

    def forward(self, **kwargs: Any) -> Any:
        return self.lm(**kwargs)

    def remove_hooks(self) -> None:
        self._hooks.__exit__()


class ResponseLoss(nn.Module):
    """Wraps a causal LM (or a :class:`DeltaModel`): ``forward(input_ids, attention_mask,
    labels)`` returns the mean token cross-entropy over the positions whose label is not -100,
    computing the output projection only there (equal to ``lm(..., labels=labels).loss``).
    Models with final-logit soft-capping fall back to the model's own loss."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        lm = getattr(self.net, "lm", self.net)
        if getattr(lm.config, "final_logit_softcapping", None):
            return self.net(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        h = lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        tgt = labels[:, 1:]
        sel = tgt != -100
        logits = lm.get_output_embeddings()(h[:, :-1][sel])
        return F.cross_entropy(logits.float(), tgt[sel])


def encode_pairs(tok, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids with BOS, response ids = answer + EOS)`` per pair."""
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    return [(q, a + eos) for q, a in (encode_pair(tok, p, a) for p, a in pairs)]


def make_batch(
    encoded: list[tuple[list[int], list[int]]], rows: np.ndarray, pad: int
) -> dict[str, torch.Tensor]:
    seqs = [encoded[i] for i in rows]
    L = max(len(p) + len(r) for p, r in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    labels = torch.full((len(seqs), L), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, (p, r) in enumerate(seqs):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
        mask[i, : len(p) + len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class SFTRecipe(Recipe):
    """Fine-tuning of ``params`` of ``module`` on ``pairs`` through a DeepSpeed engine (AdamW,
    cosine lr from ``lr`` without warm-up), one batch of ``batch`` pairs per step drawn from
    ``(seed, 11)``; every ``log_every`` steps (and at the last) the step's loss joins
    :attr:`history`. The trainer runs the engine's forward, backward and step."""

    def __init__(
        self,
        module: nn.Module,
        params: list[nn.Parameter],
        tok,  # noqa: ANN001
        pairs: Sequence[tuple[str, str]],
        *,
        steps: int,
        batch: int,
        lr: float,
        seed: int,
        deepspeed_opts: Any,
        log_every: int = 100,
        log=print,  # noqa: ANN001
    ) -> None:
        super().__init__(
            deepspeed_opts.model_copy(update={"lr": lr, "micro_batch": batch, "grad_accum": 1})
        )
        self.module, self.params, self.tok, self.pairs = module, params, tok, pairs
        self.steps, self.batch, self.lr, self.seed = steps, batch, lr, seed
        self.log_every, self.log = log_every, log
        self.samples_per_step = batch

    def build(self) -> None:
        from nshot.train.deepspeed import build_engine

        torch.manual_seed(self.seed)
        self.engine = build_engine(ResponseLoss(self.module), self.cfg, params=self.params)
        self.model = self.module  # trained in train mode; the engine placed it
        self.enc = encode_pairs(self.tok, self.pairs)
        self.pad = pad_token_id(self.tok)
        self.rng = np.random.default_rng([self.seed, 11])
        self.history: list[dict[str, float]] = []
        self.last_loss: torch.Tensor | None = None
        self.t0 = time.time()  # the training's wall time starts with the engine built

    def schedule(self) -> tuple[int, int, int]:
        return self.steps, self.log_every, self.log_every

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        for g in self.engine.optimizer.param_groups:
            g["lr"] = self.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / self.steps))
        b = make_batch(self.enc, self.rng.integers(len(self.enc), size=self.batch), self.pad)
        dev = self.engine.device
        loss = self.forward(**{k: v.to(dev) for k, v in b.items()})
        self.last_loss = loss
        return loss, {}  # the loss is read at report time only (no sync per step)

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        lv = float(self.last_loss.detach())
        self.history.append({"step": step, "loss": lv})
        self.log(f"    step {step}: loss {lv:.4f}")
        return {**metrics, "loss": lv}


def train(
    module: nn.Module,
    params: list[nn.Parameter],
    tok,
    pairs: Sequence[tuple[str, str]],
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    deepspeed_opts: Any,
    log_every: int = 100,
    log=print,
) -> dict[str, Any]:
    """Fine-tune ``params`` of ``module`` on ``pairs`` with a DeepSpeed engine (cosine lr, no
    warm-up) in this process (:class:`SFTRecipe` through the platform's trainer); returns the
    loss history and the wall time."""
    recipe = SFTRecipe(
        module, params, tok, pairs, steps=steps, batch=batch, lr=lr, seed=seed,
        deepspeed_opts=deepspeed_opts, log_every=log_every, log=log,
    )  # fmt: skip
    run_recipe(recipe, session=False)
    module.eval()
    return {"history": recipe.history, "train_s": time.time() - recipe.t0}


def run_variant(
    variant: str,
    lm_factory,
    tok,
    gids: Sequence[int] | None,
    modules: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    deepspeed_opts: Any,
    evaluate_after,
    log_every: int = 100,
    log=print,
) -> dict[str, Any]:
    """One SFT run: ``variant`` is ``full`` (every weight) or ``rows`` (Δ on ``gids``)."""
    lm = lm_factory()
    if variant == "full":
        module: nn.Module = lm
        params = [p for p in lm.parameters()]
        for p in params:
            p.requires_grad_(True)
        n_params = sum(p.numel() for p in params)
    else:
        space = NeuronSpace(lm, modules)
        module = DeltaModel(lm, space, gids or [])
        params = list(module.delta.parameters())
        n_params = module.delta.n_params
    out = train(
        module,
        params,
        tok,
        pairs,
        steps=steps,
        batch=batch,
        lr=lr,
        seed=seed,
        deepspeed_opts=deepspeed_opts,
        log_every=log_every,
        log=log,
    )
    out["trainable_params"] = float(n_params)
    out["metrics"] = evaluate_after(lm)
    if variant != "full":
        out["delta_state"] = {
            k: v.detach().to("cpu", copy=True) for k, v in module.delta.state_dict().items()
        }
        module.remove_hooks()
    return out
