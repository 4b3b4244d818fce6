"""Baselines on the same model and facts: gradient ascent and fine-tuning to neutral.

Step counts and learning rates are reconstructions (the paper does not state them): GA 10 Adam steps at lr 1e-4 on all
weights; FT 25 Adam steps at lr 1e-4 on all weights of the edited layers (FT's lr is not
stated; 1e-4 is GA's). Both modify the model in place; the caller restores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nshot.nn.lm import decoder_layers, encode_pair, model_device, pad_token_id

from .edit import EditRequest, _batch, neutral_id


def _nll_batch(tok: Any, requests: Sequence[EditRequest], neutral: bool) -> tuple:
    rows, spans, targets = [], [], []
    for r in requests:
        p, a = encode_pair(tok, r.prompt(), r.answer)
        if neutral:
            a = [neutral_id(tok)]
        rows.append(p + a[:-1])
        spans.append((len(p) - 1, len(a)))
        targets.append(a)
    ids, mask = _batch(rows, pad_token_id(tok))
    return ids, mask, spans, targets


def _mean_nll(model: Any, batch: tuple) -> torch.Tensor:
    ids, mask, spans, targets = batch
    dev = model_device(model)
    logits = model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
    losses = []
    for j, ((start, n), tgt) in enumerate(zip(spans, targets)):
        lp = torch.log_softmax(logits[j, start : start + n].float(), -1)
        losses.append(-lp[torch.arange(n, device=dev), torch.tensor(tgt, device=dev)].mean())
    return torch.stack(losses).mean()


def _train(
    model: Any, params: list[torch.nn.Parameter], loss_fn: Any, steps: int, lr: float
) -> list[float]:
    all_params = list(model.parameters())
    was = [p.requires_grad for p in all_params]
    for p in all_params:
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    history = []
    try:
        for _ in range(steps):
            loss = loss_fn()
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(float(loss))
    finally:
        for p, w in zip(all_params, was):
            p.requires_grad_(w)
        model.zero_grad(set_to_none=True)
    return history


def gradient_ascent(
    model: Any, tok: Any, requests: Sequence[EditRequest], steps: int, lr: float
) -> dict[str, Any]:
    """Maximise the true-answer NLL of the forget rewrite prompts with Adam on all weights."""
    batch = _nll_batch(tok, requests, neutral=False)
    hist = _train(model, list(model.parameters()), lambda: -_mean_nll(model, batch), steps, lr)
    return {"nll": [-h for h in hist]}


def finetune_neutral(
    model: Any,
    tok: Any,
    requests: Sequence[EditRequest],
    layers: Sequence[int],
    steps: int,
    lr: float,
) -> dict[str, Any]:
    """Minimise the neutral-target NLL of the forget rewrite prompts with Adam on all weights
    of the edited layers."""
    batch = _nll_batch(tok, requests, neutral=True)
    blocks = decoder_layers(model)
    params = [p for la in layers for p in blocks[la].parameters()]
    hist = _train(model, params, lambda: _mean_nll(model, batch), steps, lr)
    return {"nll": hist}
