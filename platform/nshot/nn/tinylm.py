"""Tiny Llama models for smoke presets and tests: their tokenizer, sizes and fact accuracy.

A word-level tokenizer (digits split into single tokens, ``<bos>``/``<eos>``/``<unk>``/``<pad>``)
is built from :func:`nshot.data.lmtext.tiny_corpus` (made-up facts in four English templates and
French, single-digit arithmetic and Python expressions, standard-library docstrings); a
``LlamaForCausalLM`` of one of :data:`SIZES` is trained on it by :mod:`nshot.train.tinylm`
(``ensure_tiny_lm``, ``pretrain``; a method's ``model`` setting ``"tiny-smoke"`` resolves to the
cached folder through ``resolve_lm_source`` there).

Sizes: ``smoke`` (2 layers, hidden 64, MLP 256; ~20 s) and ``small`` (4 layers, hidden 128, MLP
512; a few minutes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nshot.nn.lm import encode_pair, pad_token_id

__all__ = ["SIZES", "TinySize", "build_tokenizer", "fact_accuracy", "token_blocks"]

# v2: the corpus no longer depends on what the training process imported (the standard-library
# docstrings are read in a clean interpreter: nshot.data.stdlib_docs)
VERSION = "2"
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


@dataclass(frozen=True)
class TinySize:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    steps: int
    lr: float
    batch: int = 32
    seq_len: int = 64


SIZES = {
    "smoke": TinySize(layers=2, hidden=64, intermediate=256, heads=4, steps=600, lr=3e-3),
    "small": TinySize(layers=4, hidden=128, intermediate=512, heads=4, steps=2500, lr=1e-3),
}


def build_tokenizer(docs: list[str], max_words: int = 6000) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over ``docs``: words and punctuation runs are
    tokens, every digit is its own token, ``<bos>`` is prepended; the ``max_words`` most
    frequent words are kept (ties by first appearance), the rest map to ``<unk>``."""
    from collections import Counter

    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    counts: Counter[str] = Counter()
    for d in docs:
        counts.update(w for w, _ in pre.pre_tokenize_str(d))
    words = [w for w, _ in counts.most_common(max_words) if w not in SPECIALS]
    digits = [str(i) for i in range(10)]
    vocab = {t: i for i, t in enumerate(list(SPECIALS) + [d for d in digits if d not in words])}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=SIZES["smoke"].seq_len * 2,
    )


def token_blocks(tokenizer: Any, docs: list[str], seq_len: int) -> np.ndarray:
    """Every doc as ``<bos> ... <eos>``, concatenated and cut into ``[n, seq_len]`` blocks."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in tokenizer(docs)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    n = len(ids) // seq_len
    return np.asarray(ids[: n * seq_len], dtype=np.int64).reshape(n, seq_len)


def fact_accuracy(model: Any, tokenizer: Any, pairs: list[tuple[str, str]]) -> float:
    """Fraction of ``(prompt, answer)`` pairs whose every answer token is the teacher-forced
    argmax (batched, right-padded)."""
    if not pairs:
        return float("nan")
    model.eval()
    hits = 0
    with torch.no_grad():
        for i in range(0, len(pairs), 64):
            chunk = pairs[i : i + 64]
            pairs_ids = [encode_pair(tokenizer, p, a) for p, a in chunk]
            p_ids = [p for p, _ in pairs_ids]
            full = [p + a for p, a in pairs_ids]
            width = max(len(f) for f in full)
            x = torch.full((len(chunk), width), pad_token_id(tokenizer), dtype=torch.long)
            mask = torch.zeros_like(x)
            for j, f in enumerate(full):
                x[j, : len(f)] = torch.tensor(f)
                mask[j, : len(f)] = 1
            pred = model(input_ids=x, attention_mask=mask).logits.argmax(-1)
            for j, (p, f) in enumerate(zip(p_ids, full, strict=True)):
                ans = torch.tensor(f[len(p) :])
                got = pred[j, len(p) - 1 : len(f) - 1]
                hits += int(torch.equal(got, ans))
    return hits / len(pairs)
