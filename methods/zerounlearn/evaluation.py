"""ZeroUnlearn's metrics: Eff, Gen, Spe, PPL and the neutral rate.

Every metric is teacher-forced and batched: a prompt counts as "known" when its answer's tokens
are the argmax at every answer position. The LM head runs only at the positions that are scored.
Batches go to the model's device; only the scores come back to the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nshot.nn.lm import encode, encode_pair, model_device, pad_token_id

from .edit import EditRequest, _batch, neutral_id


@dataclass(frozen=True)
class EvalSet:
    """The prompts one evaluation scores (fixed per run so every system sees the same ones)."""

    forget: tuple[EditRequest, ...]
    retain: tuple[EditRequest, ...]
    ppl_chunks: tuple[tuple[int, ...], ...]


def ppl_chunks(tok: Any, texts: Sequence[str], n_chunks: int, length: int) -> list[list[int]]:
    """The first ``n_chunks`` chunks of ``length`` tokens of held-out text (one or more per
    paragraph; shorter tails of at least 8 tokens are kept)."""
    out: list[list[int]] = []
    for text in texts:
        ids = encode(tok, text)
        for b in range(0, len(ids), length):
            piece = ids[b : b + length]
            if len(piece) >= 8:
                out.append(piece)
            if len(out) >= n_chunks:
                return out
    return out


@torch.no_grad()
def score(
    model: Any, tok: Any, items: Sequence[tuple[str, str]], batch_size: int = 64
) -> tuple[list[bool], list[bool]]:
    """For each ``(prompt, answer)``: whether the answer is the teacher-forced argmax at every
    answer position, and whether the greedy next token after the prompt is the neutral target."""
    rows, spans, targets = [], [], []
    for prompt, answer in items:
        p, a = encode_pair(tok, prompt, answer)
        rows.append(p + a[:-1])
        spans.append((len(p) - 1, len(a)))
        targets.append(a)
    head = model.get_output_embeddings()
    dev = model_device(model)
    eos = neutral_id(tok)
    known: list[bool] = []
    neutral: list[bool] = []
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    res: dict[int, tuple[bool, bool]] = {}
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        ids, mask = _batch([rows[i] for i in idx], pad_token_id(tok), dev)
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        for j, i in enumerate(idx):
            start, n = spans[i]
            pred = head(hidden[j, start : start + n]).argmax(-1).tolist()
            res[i] = (pred == targets[i], pred[0] == eos)
    for i in range(len(rows)):
        known.append(res[i][0])
        neutral.append(res[i][1])
    return known, neutral


@torch.no_grad()
def perplexity(
    model: Any, tok: Any, chunks: Sequence[Sequence[int]], batch_size: int = 16
) -> float:
    """exp of the mean token NLL over ``chunks`` (every predicted token counts once)."""
    head = model.get_output_embeddings()
    dev = model_device(model)
    total, count = 0.0, 0
    for b in range(0, len(chunks), batch_size):
        ids, mask = _batch(chunks[b : b + batch_size], pad_token_id(tok), dev)
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        valid = mask[:, 1:].bool()
        h = hidden[:, :-1][valid]
        tgt = ids[:, 1:][valid]
        logp = torch.log_softmax(head(h).float(), -1)
        total += float(-logp[torch.arange(len(tgt), device=dev), tgt].sum())
        count += int(valid.sum())
    return math.exp(total / max(count, 1))


def evaluate_model(model: Any, tok: Any, es: EvalSet) -> dict[str, float]:
    """``eff``, ``gen``, ``spe`` (×100), ``ppl`` and ``neutral_rate`` (×100) on ``es``."""
    return evaluate_instances(model, tok, es)[0]


def evaluate_instances(
    model: Any, tok: Any, es: EvalSet
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The metrics of :func:`evaluate_model` and the per-forget-fact values behind the forget
    metrics, in the order of ``es.forget``: ``eff`` and ``neutral_rate`` (0 or 100 per fact) and
    ``gen`` (×100, the share of the fact's paraphrases answered; facts without paraphrases are
    left out, the same facts for every model). Their means are the metrics; they pair one
    system with another fact by fact (the claims' per-instance samples)."""
    items: list[tuple[str, str]] = []
    kinds: list[tuple[str, int]] = []
    for i, r in enumerate(es.forget):
        items.append((r.prompt(), r.answer))
        kinds.append(("eff", i))
        for t in r.paraphrases:
            items.append((r.prompt(t), r.answer))
            kinds.append(("gen", i))
    for i, r in enumerate(es.retain):
        items.append((r.prompt(), r.answer))
        kinds.append(("spe", i))
    known, neutral = score(model, tok, items)
    eff = [100.0 * k for k, (kind, _) in zip(known, kinds) if kind == "eff"]
    neu = [100.0 * n for n, (kind, _) in zip(neutral, kinds) if kind == "eff"]
    spe = [k for k, (kind, _) in zip(known, kinds) if kind == "spe"]
    per_req: dict[int, list[bool]] = {}
    for k, (kind, i) in zip(known, kinds):
        if kind == "gen":
            per_req.setdefault(i, []).append(k)
    gen = [100.0 * sum(per_req[i]) / len(per_req[i]) for i in sorted(per_req)]

    def mean(v: Sequence[float]) -> float:
        return sum(v) / len(v) if v else float("nan")

    metrics = {
        "eff": mean(eff),
        "gen": mean(gen),
        "spe": 100.0 * mean(spe),
        "ppl": perplexity(model, tok, es.ppl_chunks) if es.ppl_chunks else float("nan"),
        "neutral_rate": mean(neu),
    }
    return metrics, {"eff": eff, "gen": gen, "neutral_rate": neu}
