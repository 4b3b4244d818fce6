"""Capability evaluation: exact match on four capabilities plus held-out perplexity.

Two suites, both offline:

* ``natural`` (real pretrained models such as SmolLM2-135M-Instruct): *facts* (capital-city
  completions from :func:`nshot.data.lmtext.real_facts`), *math* (two-shot single- and two-digit
  addition), *code* (two-shot Python REPL: the value of a simple expression) and *multilingual*
  (two-shot English→French word translation). Candidates are built here and **filtered to the
  items the unablated model answers correctly** (reconstruction: a 135M model answers too few
  items of any fixed set to measure a collapse ratio on them otherwise); the candidate counts and
  the base accuracy on all candidates are recorded with the results.
* ``tiny`` (the tiny LMs nshot trains): :func:`nshot.data.lmtext.tiny_capabilities`.

Exact match is scored by teacher forcing, which equals greedy decoding: an item is correct iff
the model's argmax at every answer position is the answer token *and* the argmax after the answer
does not continue the word (a token that decodes to a letter or digit glued to the answer, e.g.
``4`` after ``1`` for the answer ``1``). Sequences are right-padded, so padding never changes the
scored positions; the vocabulary projection is applied to the scored positions only.
Perplexity is ``exp`` of the mean token NLL over held-out standard-library docstring paragraphs
(:func:`nshot.data.lmtext.general_text` ``"heldout"``), each truncated to ``ppl_tokens``.
Every sequence starts with the tokenizer's BOS token.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from nshot.nn.lm import encode as lm_encode
from nshot.nn.lm import encode_pair as lm_encode_pair
from nshot.nn.lm import pad_token_id

if TYPE_CHECKING:
    from .config import KeystoneConfig

CAPABILITIES = ("facts", "math", "code", "multilingual")

Item = tuple[str, str]

# --------------------------------------------------------------------------- natural suite

_MATH_SHOTS = "2 + 2 = 4\n3 + 5 = 8\n"
_CODE_SHOTS = ">>> len([1, 2])\n2\n>>> max(4, 9)\n9\n"
_FR_SHOTS = "English: dog\nFrench: chien\nEnglish: cat\nFrench: chat\n"

# common English -> French words (reconstruction: a hand-written list)
_EN_FR = """
house:maison water:eau book:livre red:rouge car:voiture apple:pomme bread:pain sun:soleil
moon:lune tree:arbre black:noir white:blanc day:jour night:nuit woman:femme man:homme
child:enfant city:ville sea:mer sky:ciel fire:feu earth:terre flower:fleur bird:oiseau
fish:poisson horse:cheval cow:vache milk:lait cheese:fromage wine:vin school:école
friend:ami mother:mère father:père brother:frère sister:sœur king:roi queen:reine door:porte
window:fenêtre table:table chair:chaise bed:lit hand:main head:tête eye:œil mouth:bouche
heart:cœur green:vert blue:bleu yellow:jaune small:petit big:grand new:nouveau old:vieux
good:bon year:année week:semaine hour:heure time:temps life:vie love:amour war:guerre
peace:paix money:argent work:travail game:jeu music:musique song:chanson letter:lettre
word:mot name:nom country:pays river:rivière mountain:montagne forest:forêt road:route
street:rue train:train boat:bateau plane:avion garden:jardin kitchen:cuisine room:chambre
summer:été winter:hiver spring:printemps morning:matin evening:soir rain:pluie snow:neige
wind:vent cold:froid hot:chaud one:un two:deux three:trois four:quatre five:cinq six:six
seven:sept eight:huit nine:neuf ten:dix hello:bonjour thanks:merci yes:oui no:non
"""


def _en_fr() -> list[tuple[str, str]]:
    return [tuple(p.split(":")) for p in _EN_FR.split()]  # type: ignore[misc]


def natural_candidates(per_capability: int = 120, seed: int = 0) -> dict[str, list[Item]]:
    """Candidate items of the natural suite (before filtering by the base model)."""
    from nshot.data.lmtext import real_facts

    rng = random.Random(f"keystone-natural-{seed}")
    facts = [(f.prompt(0), f.answer) for f in real_facts() if f.relation == "capital"]
    pairs = [(a, b) for a in range(1, 20) for b in range(1, 20)]
    rng.shuffle(pairs)
    math_items = [(f"{_MATH_SHOTS}{a} + {b} =", str(a + b)) for a, b in pairs]
    code = []
    for _ in range(4 * per_capability):
        kind = rng.randrange(7)
        a, b, c = rng.randrange(1, 10), rng.randrange(1, 10), rng.randrange(1, 10)
        expr = [
            f"max({a}, {b})",
            f"min({a}, {b})",
            f"abs(-{a})",
            f"len([{', '.join(str(rng.randrange(10)) for _ in range(a))}])",
            f"sum([{a}, {b}, {c}])",
            f"{a} * {b}",
            f"max([{a}, {b}, {c}])",
        ][kind]
        code.append((f"{_CODE_SHOTS}>>> {expr}\n", repr(eval(expr))))  # noqa: S307 - literal ints
    code = list(dict.fromkeys(code))
    fr = [(f"{_FR_SHOTS}English: {e}\nFrench:", f) for e, f in _en_fr()]
    out = {"facts": facts, "math": math_items, "code": code, "multilingual": fr}
    for k, v in out.items():
        v = list(v)
        random.Random(f"keystone-{k}-{seed}").shuffle(v)
        out[k] = v[:per_capability]
    return out


def tiny_items(n: int | None = None, seed: int = 0) -> dict[str, list[Item]]:
    """The tiny LMs' capability items; with ``n``, a fixed random subset of ``n`` per capability
    (the lists are ordered by operand, so a prefix would not be representative)."""
    from nshot.data.lmtext import tiny_capabilities

    caps = tiny_capabilities("eval")
    if n is None:
        return caps
    out = {}
    for k, v in caps.items():
        v = list(v)
        random.Random(f"keystone-tiny-{k}-{seed}").shuffle(v)
        out[k] = v[:n]
    return out


# --------------------------------------------------------------------------- scoring


def encode(tok, text: str) -> list[int]:
    """Token ids of ``text`` with exactly one leading BOS (when the tokenizer has one)."""
    return lm_encode(tok, text, bos="always")


def encode_pair(tok, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """``(prompt ids with BOS, answer ids)`` as the model reads them joined
    (:func:`nshot.nn.lm.encode_pair`: one space before the answer, none after a newline)."""
    return lm_encode_pair(tok, prompt, answer, bos="always")


@dataclass
class _Batch:
    prefix: torch.Tensor  # [P] tokens shared by every item of the capability (run once)
    ids: torch.Tensor  # [B, L] right-padded, after the prefix
    mask: torch.Tensor  # [B, L]
    rows: torch.Tensor  # [P] batch row of each scored position
    cols: torch.Tensor  # [P] position whose logits predict the target
    targets: torch.Tensor  # [P] target token, -1 at the terminator position
    item_of: torch.Tensor  # [P] item index (within the batch)
    answers: list[list[int]]
    n: int


def _common_prefix(seqs: list[list[int]]) -> int:
    """Length of the token prefix shared by all sequences, leaving >= 1 token in each."""
    if len(seqs) < 2:
        return 0
    n = min(len(x) for x in seqs) - 1
    first = seqs[0]
    for i in range(max(n, 0)):
        if any(x[i] != first[i] for x in seqs):
            return i
    return max(n, 0)


def _hidden(inner, b: _Batch, dev) -> torch.Tensor:
    """Last hidden states of a batch; a shared prefix is computed once and its KV cache reused
    by every row (positions continue after it)."""
    ids, mask = b.ids.to(dev), b.mask.to(dev)
    n_pre = int(b.prefix.numel())
    if n_pre == 0:
        return inner(input_ids=ids, attention_mask=mask).last_hidden_state
    pre = inner(input_ids=b.prefix[None].to(dev), use_cache=True)
    cache = getattr(pre, "cache", None) or pre.past_key_values
    cache.batch_repeat_interleave(ids.shape[0])
    full_mask = torch.cat([torch.ones(ids.shape[0], n_pre, dtype=mask.dtype, device=dev), mask], 1)
    pos = torch.arange(n_pre, n_pre + ids.shape[1], device=dev)[None].expand(ids.shape[0], -1)
    return inner(
        input_ids=ids,
        attention_mask=full_mask,
        position_ids=pos,
        use_cache=True,
        **{_cache_kw(inner): cache},
    ).last_hidden_state


def _cache_kw(inner) -> str:
    """The KV-cache argument's name: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


@dataclass
class Evaluator:
    """Exact match on every capability and perplexity, for one model and tokenizer.

    ``__call__(model)`` runs the model (with whatever hooks are active) and returns
    ``{"acc": mean over capabilities, "acc_<cap>": ..., "ppl": ...}``.
    """

    tok: object
    items: dict[str, list[Item]]
    ppl_texts: list[str] = field(default_factory=list)
    ppl_tokens: int = 64
    batch_size: int = 32
    _batches: dict[str, list[_Batch]] = field(default_factory=dict, init=False)
    _ppl: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list, init=False)
    _cont: dict[tuple, bool] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        pad = pad_token_id(self.tok)
        for cap, items in self.items.items():
            enc = [encode_pair(self.tok, p, a) for p, a in items]
            n_pre = _common_prefix([p for p, _ in enc])
            prefix = torch.tensor(enc[0][0][:n_pre] if enc else [], dtype=torch.long)
            enc = [(p[n_pre:], a) for p, a in enc]
            self._batches[cap] = []
            for s in range(0, len(enc), self.batch_size):
                chunk = enc[s : s + self.batch_size]
                L = max(len(p) + len(a) for p, a in chunk)
                ids = torch.full((len(chunk), L), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), L), dtype=torch.long)
                rows, cols, tg, it = [], [], [], []
                for r, (p, a) in enumerate(chunk):
                    seq = p + a
                    ids[r, : len(seq)] = torch.tensor(seq)
                    mask[r, : len(seq)] = 1
                    for j, t in enumerate(a):
                        rows.append(r), cols.append(len(p) - 1 + j), tg.append(t), it.append(r)
                    rows.append(r), cols.append(len(seq) - 1), tg.append(-1), it.append(r)
                self._batches[cap].append(
                    _Batch(
                        prefix,
                        ids,
                        mask,
                        torch.tensor(rows),
                        torch.tensor(cols),
                        torch.tensor(tg),
                        torch.tensor(it),
                        [a for _, a in chunk],
                        len(chunk),
                    )
                )
        texts = [encode(self.tok, t)[: self.ppl_tokens] for t in self.ppl_texts]
        texts = [t for t in texts if len(t) >= 8]
        for s in range(0, len(texts), self.batch_size):
            chunk = texts[s : s + self.batch_size]
            L = max(len(t) for t in chunk)
            ids = torch.full((len(chunk), L), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), L), dtype=torch.long)
            for r, t in enumerate(chunk):
                ids[r, : len(t)] = torch.tensor(t)
                mask[r, : len(t)] = 1
            self._ppl.append((ids, mask))

    @property
    def n_items(self) -> dict[str, int]:
        return {c: len(v) for c, v in self.items.items()}

    def _continues(self, ans: list[int], nxt: int) -> bool:
        key = (tuple(ans[-2:]), nxt)
        hit = self._cont.get(key)
        if hit is None:
            if nxt == self.tok.eos_token_id:
                hit = False
            else:
                head = self.tok.decode(ans[-2:])
                full = self.tok.decode([*ans[-2:], nxt])
                tail = full[len(head) :] if full.startswith(head) else " "
                word = self.tok.decode([nxt]).strip()
                # glued to the answer, or a digit after a digit (word-level tokenizers put a
                # space between single-digit tokens: "1 2" is the number 12)
                hit = (bool(tail) and tail[0].isalnum()) or (
                    head[-1:].isdigit() and word[:1].isdigit()
                )
            self._cont[key] = hit
        return hit

    @torch.no_grad()
    def correct(self, model) -> dict[str, np.ndarray]:
        """Per capability, a boolean array: which items the model answers exactly."""
        dev = next(model.parameters()).device
        inner, head = model.get_decoder(), model.get_output_embeddings()
        out: dict[str, np.ndarray] = {}
        for cap, batches in self._batches.items():
            res = []
            for b in batches:
                h = _hidden(inner, b, dev)
                pred = head(h[b.rows.to(dev), b.cols.to(dev)]).argmax(-1).cpu()
                ok = np.ones(b.n, dtype=bool)
                hit = (pred == b.targets) | (b.targets < 0)
                for i in range(b.n):
                    sel = b.item_of == i
                    if not bool(hit[sel].all()):
                        ok[i] = False
                    else:
                        ok[i] = not self._continues(b.answers[i], int(pred[sel][-1]))
                res.append(ok)
            out[cap] = np.concatenate(res) if res else np.zeros(0, dtype=bool)
        return out

    @torch.no_grad()
    def perplexity(self, model) -> float:
        if not self._ppl:
            return float("nan")
        dev = next(model.parameters()).device
        nll, count = 0.0, 0
        for ids, mask in self._ppl:
            logits = model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
            tgt = ids[:, 1:].to(dev).masked_fill(mask[:, 1:].to(dev) == 0, -100)
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                tgt.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            nll += float(loss)
            count += int((tgt != -100).sum())
        v = math.exp(min(nll / max(count, 1), 700.0))
        return v

    def __call__(self, model, ppl: bool = True) -> dict[str, float]:
        corr = self.correct(model)
        out = {f"acc_{c}": float(v.mean()) if v.size else float("nan") for c, v in corr.items()}
        out["acc"] = float(np.mean([out[f"acc_{c}"] for c in corr]))
        if ppl:
            out["ppl"] = self.perplexity(model)
        return out


def filter_items(
    evaluator_factory: Callable[[dict[str, list[Item]]], Evaluator],
    model,
    candidates: dict[str, list[Item]],
    n_items: int,
) -> tuple[dict[str, list[Item]], dict[str, dict[str, float]]]:
    """Keep, per capability, the first ``n_items`` candidates the model answers correctly.

    Returns the kept items and, per capability, the candidate count and base accuracy on them.
    """
    ev = evaluator_factory(candidates)
    corr = ev.correct(model)
    kept, info = {}, {}
    for cap, items in candidates.items():
        ok = corr[cap]
        kept[cap] = [it for it, c in zip(items, ok) if c][:n_items]
        info[cap] = {
            "candidates": float(len(items)),
            "base_acc_all_candidates": float(ok.mean()) if ok.size else 0.0,
            "kept": float(len(kept[cap])),
        }
    return kept, info


def ppl_texts(n: int) -> list[str]:
    from nshot.data.lmtext import general_text

    texts = [t for t in general_text("heldout") if len(t) > 200]
    return texts[:n]


def mean_over(values: Sequence[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Mean and standard deviation of each metric over several runs."""
    keys = values[0].keys()
    mean = {k: float(np.mean([v[k] for v in values])) for k in keys}
    std = {
        k: float(np.std([v[k] for v in values], ddof=1)) if len(values) > 1 else 0.0 for k in keys
    }
    return mean, std


# --------------------------------------------------------------------------- a model's evaluator


def _items_cache_path(source: str, cands: dict) -> Path:
    from nshot.data.cache import cache_dir

    h = hashlib.sha256(json.dumps([source, cands], sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "keystone" / f"items-{h}.json"


def build_evaluator(model, tok, source: str, cfg: KeystoneConfig) -> tuple[Evaluator, dict]:
    """The capability evaluator of ``source`` (natural suite: filtered by the base model, the
    filtered items cached under ``NSHOT_CACHE/keystone``)."""
    ppl = ppl_texts(cfg.ppl_texts)

    def factory(items: dict) -> Evaluator:
        return Evaluator(tok, items, ppl, ppl_tokens=cfg.ppl_tokens, batch_size=cfg.eval_batch)

    if cfg.suite(source) == "tiny":
        items = tiny_items(cfg.eval_items)
        info = {k: {"items": float(len(v))} for k, v in items.items()}
        return factory(items), info
    cands = natural_candidates(cfg.eval_candidates, seed=0)
    path = _items_cache_path(source, cands)
    if path.is_file():
        stored = json.loads(path.read_text())
        kept = {k: [tuple(x) for x in v] for k, v in stored["kept"].items()}
        info = stored["info"]
    else:
        kept, info = filter_items(
            lambda it: Evaluator(tok, it, batch_size=cfg.eval_batch), model, cands, 10_000
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"kept": kept, "info": info}))
    kept = {k: v[: cfg.eval_items] for k, v in kept.items()}
    for k in info:
        info[k]["kept"] = float(len(kept[k]))
    empty = [k for k, v in kept.items() if not v]
    if empty:
        from nshot.method import NshotError

        raise NshotError(
            f"model {source!r} answers none of the {', '.join(empty)} candidates: nothing to "
            "measure a collapse on"
        )
    return factory(kept), info
