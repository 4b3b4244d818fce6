"""Baselines on the same model and facts: gradient ascent and fine-tuning to neutral.

Gradient ascent (GA) trains, as in the authors' GA baseline, the ``down_proj`` of the last
edited layer (``params="down_proj"``; ``"all"``: every weight, nshot's first reconstruction).
Its budget is either fixed (``steps`` Adam steps at ``lr``) or chosen per seed by
:func:`validate_ga_budget` on held-out forget facts: for each learning rate of a grid, ascend
until the held-out facts are forgotten (the ``forgets`` bar, Eff ≤ 10) or ``max_steps``; the
retained-fact accuracy on other held-out facts, measured at each learning rate's stop, picks the
learning rate. The test forget facts and the evaluated retained facts are never seen by the
protocol. FT: 25 Adam steps at lr 1e-4 on all weights of the edited layers (reconstruction:
FT's lr is not stated). Every function modifies the model in place; the caller restores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nshot.nn.lm import decoder_layers, encode_pair, mlp, model_device, pad_token_id

from .edit import EditRequest, _batch, neutral_id

#: what gradient ascent trains: the authors' choice (the down_proj of the last edited layer) or
#: every weight
GA_PARAMS = ("down_proj", "all")


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
    model: Any,
    params: list[torch.nn.Parameter],
    loss_fn: Any,
    steps: int,
    lr: float,
    stop: Any = None,
) -> list[float]:
    """Adam on ``params`` for ``steps`` steps; ``stop(step)`` (1-based, after the step) may end
    it early by returning True."""
    all_params = list(model.parameters())
    was = [p.requires_grad for p in all_params]
    for p in all_params:
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    history = []
    try:
        for step in range(1, steps + 1):
            loss = loss_fn()
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(float(loss.detach()))
            if stop is not None and stop(step):
                break
    finally:
        for p, w in zip(all_params, was):
            p.requires_grad_(w)
        model.zero_grad(set_to_none=True)
    return history


def ga_parameters(model: Any, params: str, layers: Sequence[int]) -> list[torch.nn.Parameter]:
    """The weights gradient ascent trains: ``down_proj`` of the last of ``layers`` (the authors'
    GA baseline) or ``all``."""
    if params == "all":
        return list(model.parameters())
    if params == "down_proj":
        return list(mlp(model, max(layers)).down_proj.parameters())
    raise ValueError(f"gradient ascent trains {GA_PARAMS}, not {params!r}")


def gradient_ascent(
    model: Any,
    tok: Any,
    requests: Sequence[EditRequest],
    steps: int,
    lr: float,
    params: str = "all",
    layers: Sequence[int] = (),
) -> dict[str, Any]:
    """Maximise the true-answer NLL of the forget rewrite prompts with Adam on the weights
    :func:`ga_parameters` names."""
    batch = _nll_batch(tok, requests, neutral=False)
    weights = ga_parameters(model, params, layers)
    hist = _train(model, weights, lambda: -_mean_nll(model, batch), steps, lr)
    return {"nll": [-h for h in hist], "lr": lr, "steps": steps, "params": params}


def validate_ga_budget(
    model: Any,
    tok: Any,
    val_forget: Sequence[EditRequest],
    val_retain: Sequence[EditRequest],
    lrs: Sequence[float],
    max_steps: int,
    params: str = "down_proj",
    layers: Sequence[int] = (),
    forget_bar: float = 10.0,
) -> dict[str, Any]:
    """Gradient ascent's learning rate and step count, chosen on held-out facts.

    For each ``lr`` (from the unedited weights): ascend on ``val_forget``'s rewrite prompts and
    stop after the first step at which at most ``forget_bar`` % of them are still answered
    (teacher-forced argmax, as Eff), or after ``max_steps``. At that stop, measure the accuracy
    on ``val_retain`` (as Spe). The budget is the stop of the learning rate that forgot with the
    highest retained accuracy (then fewer steps, then the smaller lr); when none forgot, the
    one that forgot most (then the highest retained accuracy). The trained weights are restored
    before returning."""
    from .evaluation import score

    if not val_forget or not val_retain:
        raise ValueError("the gradient-ascent validation needs held-out forget and retain facts")
    weights = ga_parameters(model, params, layers)
    saved = [w.detach().clone() for w in weights]
    forget_items = [(r.prompt(), r.answer) for r in val_forget]
    retain_items = [(r.prompt(), r.answer) for r in val_retain]

    def pct(flags: Sequence[bool]) -> float:
        return 100.0 * sum(flags) / len(flags)

    base_spe = pct(score(model, tok, retain_items)[0])
    batch = _nll_batch(tok, val_forget, neutral=False)
    runs: list[dict[str, Any]] = []
    try:
        for lr in lrs:
            trace: list[float] = []

            def forgotten(step: int, trace: list[float] = trace) -> bool:
                trace.append(pct(score(model, tok, forget_items)[0]))
                return trace[-1] <= forget_bar

            _train(model, weights, lambda: -_mean_nll(model, batch), max_steps, lr, forgotten)
            runs.append(
                {
                    "lr": float(lr),
                    "steps": len(trace),
                    "val_eff": trace[-1],
                    "val_spe": pct(score(model, tok, retain_items)[0]),
                    "val_eff_trace": trace,
                    "forgot": trace[-1] <= forget_bar,
                }
            )
            with torch.no_grad():
                for w, w0 in zip(weights, saved):
                    w.copy_(w0)
    finally:
        with torch.no_grad():
            for w, w0 in zip(weights, saved):
                w.copy_(w0)
    forgot = [r for r in runs if r["forgot"]]
    if forgot:
        best = min(forgot, key=lambda r: (-r["val_spe"], r["steps"], r["lr"]))
    else:
        best = min(runs, key=lambda r: (r["val_eff"], -r["val_spe"], r["steps"], r["lr"]))
    return {
        "lr": best["lr"],
        "steps": best["steps"],
        "forgot_on_validation": bool(best["forgot"]),
        "val_spe_base": base_spe,
        "n_val_forget": len(val_forget),
        "n_val_retain": len(val_retain),
        "runs": runs,
    }


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
