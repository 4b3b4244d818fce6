"""One ZeroUnlearn run end to end: model, facts, splits, statistics, edit, evaluation.

:func:`setup` builds everything a seed needs (shared by ``train_loop``, ``evaluate`` and
``experiments``); :func:`run_systems` runs the method, its ablations and the baselines of one
seed on the same facts and prompts and returns their metrics.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

import torch

from nshot.method import ConfigError

from .baselines import finetune_neutral, gradient_ascent, validate_ga_budget
from .config import ZeroUnlearnConfig
from .edit import (
    DeltaHParams,
    EditHParams,
    EditRequest,
    KeyStats,
    Prepared,
    apply_edit,
    context_templates,
    edited_weights,
    entity_text,
    fact_text,
    key_statistics,
    load_edited_weights,
    model_fingerprint,
    prepare,
)
from .evaluation import EvalSet, evaluate_instances, ppl_chunks, score

SYSTEMS = (
    "base",
    "zerounlearn",
    "zerounlearn_gd",
    "memit",
    "alphaedit",
    "gradient_ascent",
    "finetune_neutral",
    "wo_op",
    "wo_ut",
)
VARIANT_OF = {
    "zerounlearn": "zerounlearn",
    "zerounlearn_gd": "gd",
    "memit": "memit",
    "alphaedit": "alphaedit",
    "wo_op": "wo_op",
    "wo_ut": "wo_ut",
}


def load_model(cfg: ZeroUnlearnConfig, device: str | None = None) -> tuple[Any, Any]:
    """The model (frozen, on ``device`` or else ``cfg.device``) and its tokenizer; the edit's
    layers are checked against the model."""
    from nshot.nn.lm import load_causal_lm, resolve_device
    from nshot.train.tinylm import resolve_lm_source

    model, tok = load_causal_lm(
        resolve_lm_source(cfg.model),
        allow_download=cfg.allow_download,
        device=resolve_device(device or cfg.device),
    )
    for p in model.parameters():
        p.requires_grad_(False)
    n_layers = model.config.num_hidden_layers
    d = model.config.hidden_size
    if max(cfg.edit_layers) >= n_layers:
        raise ConfigError(
            f"ZeroUnlearnConfig: field 'edit_layers': {cfg.edit_layers} out of range for "
            f"{cfg.model} ({n_layers} layers)"
        )
    if cfg.v_loss_layer >= n_layers:
        raise ConfigError(
            f"ZeroUnlearnConfig: field 'v_loss_layer': {cfg.v_loss_layer} out of range for "
            f"{cfg.model} ({n_layers} layers)"
        )
    if cfg.n_forget > d // 4:
        raise ConfigError(
            f"ZeroUnlearnConfig: field 'n_forget': {cfg.n_forget} facts exceed d/4 = {d // 4} "
            f"(hidden size {d}): the soft projector would shrink most of the space"
        )
    return model, tok


SUBJECT_FIRST = {"capital": "{}'s capital is", "language": "{}'s official language is"}


def candidate_requests(cfg: ZeroUnlearnConfig) -> list[EditRequest]:
    from nshot.data.lmtext import real_facts, synthetic_facts

    tiny = cfg.model.startswith("tiny-")
    if tiny and cfg.rewrite_prompt != "relation_first":
        raise ConfigError(
            "ZeroUnlearnConfig: field 'rewrite_prompt': 'subject_first' needs the real facts "
            "of a pretrained model; the tiny LMs know their facts in fixed templates"
        )
    if tiny:
        facts = synthetic_facts()
    else:
        facts = [f for f in real_facts() if f.relation in cfg.relations]
    if cfg.rewrite_prompt == "subject_first":
        missing = sorted(set(cfg.relations) - set(SUBJECT_FIRST))
        if missing:
            raise ConfigError(
                f"ZeroUnlearnConfig: field 'rewrite_prompt': 'subject_first' has rewrite "
                f"prompts for {sorted(SUBJECT_FIRST)} only, not {missing} (set 'relations')"
            )
        return [
            EditRequest(
                SUBJECT_FIRST[f.relation],
                f.subject,
                f.answer,
                tuple(t for t in f.templates if not t.startswith("{}")),
                f.relation,
            )
            for f in facts
        ]
    return [
        EditRequest(f.templates[0], f.subject, f.answer, tuple(f.templates[1:]), f.relation)
        for f in facts
    ]


def hparams(cfg: ZeroUnlearnConfig) -> tuple[EditHParams, DeltaHParams, DeltaHParams]:
    hp = EditHParams(
        layers=tuple(cfg.edit_layers),
        lam_w=cfg.lam_w,
        lam_f=cfg.lam_f,
        lam_r=cfg.lam_r,
        eps=cfg.eps,
        consistent_stats=cfg.consistent_stats,
        gd_steps=cfg.gd_steps,
        gd_lr=cfg.gd_lr,
        null_threshold=cfg.null_threshold,
        alphaedit_threshold=cfg.alphaedit_threshold,
        alphaedit_l2=cfg.alphaedit_l2,
    )
    common = dict(
        steps=cfg.delta_steps,
        weight_decay=cfg.weight_decay,
        clamp=cfg.clamp_factor,
        kl_factor=cfg.kl_factor,
    )
    return hp, DeltaHParams(lr=cfg.delta_lr, **common), DeltaHParams(lr=cfg.remap_lr, **common)


@dataclass
class Setup:
    cfg: ZeroUnlearnConfig
    seed: int
    model: Any
    tok: Any
    fingerprint: str
    forget: list[EditRequest]
    retain: list[EditRequest]
    evalset: EvalSet
    stats: dict[int, KeyStats]
    templates: list[str]
    info: dict[str, Any] = field(default_factory=dict)
    # held-out facts of gradient ascent's budget protocol (from the forget pool, disjoint from
    # the forget set and from the evaluated retained facts)
    ga_val_forget: list[EditRequest] = field(default_factory=list)
    ga_val_retain: list[EditRequest] = field(default_factory=list)


def pools(
    known: list[EditRequest], split: str = "fact"
) -> tuple[list[EditRequest], list[EditRequest]]:
    """Retain and forget pools: after a fixed shuffle, the first half of the facts (``fact``) or
    of the subjects (``subject``: the pools share no subject) is the retain pool."""
    if split == "fact":
        kn = list(known)
        random.Random(0).shuffle(kn)
        return kn[: len(kn) // 2], kn[len(kn) // 2 :]
    subjects = sorted({r.subject for r in known})
    random.Random(0).shuffle(subjects)
    keep = set(subjects[: len(subjects) // 2])
    return [r for r in known if r.subject in keep], [r for r in known if r.subject not in keep]


def split_requests(
    model: Any, tok: Any, cfg: ZeroUnlearnConfig, seed: int
) -> tuple[list[EditRequest], list[EditRequest], dict[str, Any]]:
    """Keep the facts the model knows (teacher-forced argmax on the rewrite prompt); after a
    fixed shuffle the first half is the retain pool, the second the forget pool; the forget set
    is sampled from its pool by ``seed``."""
    forget, retain, _, info = _split(model, tok, cfg, seed)
    return forget, retain, info


def _split(
    model: Any, tok: Any, cfg: ZeroUnlearnConfig, seed: int
) -> tuple[list[EditRequest], list[EditRequest], list[EditRequest], dict[str, Any]]:
    """:func:`split_requests` plus the forget pool's facts outside the forget set."""
    cands = candidate_requests(cfg)
    known, _ = score(model, tok, [(r.prompt(), r.answer) for r in cands])
    kn = [r for r, k in zip(cands, known) if k]
    retain_pool, forget_pool = pools(kn, cfg.split)
    if len(forget_pool) < cfg.n_forget:
        raise ConfigError(
            f"ZeroUnlearnConfig: field 'n_forget': {cfg.n_forget} exceeds the forget pool "
            f"({len(forget_pool)} of the {len(cands)} candidate facts are known by the model "
            f"and in the forget half)"
        )
    rng = random.Random(seed)
    forget = rng.sample(forget_pool, cfg.n_forget)
    retain = (
        rng.sample(retain_pool, cfg.n_retain) if len(retain_pool) > cfg.n_retain else retain_pool
    )
    info = {
        "candidates": len(cands),
        "known": len(kn),
        "retain_pool": len(retain_pool),
        "forget_pool": len(forget_pool),
    }
    chosen = set(forget)
    return forget, retain, [r for r in forget_pool if r not in chosen], info


def ga_validation_split(
    rest: list[EditRequest], n_forget: int, seed: int
) -> tuple[list[EditRequest], list[EditRequest]]:
    """Held-out facts for gradient ascent's budget (:func:`.baselines.validate_ga_budget`):
    ``n_forget`` (at most half of ``rest``) to forget, drawn by ``seed``, and the others as
    retained facts. ``rest`` is the forget pool without the forget set, so neither the facts
    to forget nor the evaluated retained facts (the retain pool) are among them."""
    n = min(n_forget, len(rest) // 2)
    if n < 1:
        raise ConfigError(
            "ZeroUnlearnConfig: field 'ga_budget': 'validated' needs at least two known facts "
            f"in the forget pool beyond the forget set ({len(rest)}); set ga_budget='fixed'"
        )
    val = random.Random(f"ga-validation-{seed}").sample(rest, n)
    chosen = set(val)
    return val, [r for r in rest if r not in chosen]


def _interleave(a: list[str], b: list[str]) -> list[str]:
    """a[0], b[0], a[1], b[1], ... then the rest of the longer list: a positions cap on the
    key statistics then keeps both sources."""
    return [t for pair in zip_longest(a, b) for t in pair if t is not None]


def setup(cfg: ZeroUnlearnConfig, seed: int, model_tok: tuple[Any, Any] | None = None) -> Setup:
    from nshot.data.lmtext import general_text

    t0 = time.time()
    model, tok = model_tok or load_model(cfg)
    forget, retain, rest, info = _split(model, tok, cfg, seed)
    val_forget, val_retain = ga_validation_split(rest, cfg.n_forget, seed)
    info["ga_validation"] = {"forget": len(val_forget), "retain": len(val_retain)}
    chunks = ppl_chunks(tok, general_text("heldout"), cfg.ppl_chunks, cfg.ppl_length)
    es = EvalSet(tuple(forget), tuple(retain), tuple(tuple(c) for c in chunks))
    t1 = time.time()
    texts = list(general_text("train"))
    if cfg.stats_text in ("general+entities", "general+facts"):
        cands = candidate_requests(cfg)
        extra = entity_text(sorted({r.subject for r in cands}))
        info["entity_sentences"] = len(extra)
        if cfg.stats_text == "general+facts":
            facts = fact_text(sorted({(r.relation, r.subject, r.answer) for r in cands}))
            info["fact_sentences"] = len(facts)
            extra = _interleave(facts, extra)
        texts = _interleave(extra, texts)
    stats = key_statistics(model, tok, texts, cfg.edit_layers, cfg.stats_positions)
    info["stats_s"] = time.time() - t1
    info["stats_positions"] = stats[cfg.edit_layers[0]].n
    templates = context_templates(model, tok, cfg.context_templates, seed)
    info["ppl_tokens"] = sum(len(c) - 1 for c in chunks)
    info["setup_s"] = time.time() - t0
    info["neutral_target"] = tok.eos_token
    fp = model_fingerprint(model, model.config.num_hidden_layers - 1)
    return Setup(
        cfg, seed, model, tok, fp, forget, retain, es, stats, templates, info,
        val_forget, val_retain,
    )  # fmt: skip


def prepare_edit(s: Setup) -> Prepared:
    hp, dhp, rhp = hparams(s.cfg)
    return prepare(s.model, s.tok, s.forget, s.templates, s.stats, hp, dhp, s.cfg.v_loss_layer, rhp)


def run_gradient_ascent(s: Setup) -> dict[str, Any]:
    """Gradient ascent on the forget set at its budget: fixed (``ga_steps`` at ``ga_lr``) or
    validated per seed on the held-out facts (:func:`.baselines.validate_ga_budget`, reported
    under ``budget``)."""
    cfg = s.cfg
    budget: dict[str, Any] | None = None
    steps, lr = cfg.ga_steps, cfg.ga_lr
    if cfg.ga_budget == "validated":
        budget = validate_ga_budget(
            s.model, s.tok, s.ga_val_forget, s.ga_val_retain, cfg.ga_lrs, cfg.ga_max_steps,
            cfg.ga_params, cfg.edit_layers,
        )  # fmt: skip
        steps, lr = budget["steps"], budget["lr"]
    out = gradient_ascent(s.model, s.tok, s.forget, steps, lr, cfg.ga_params, cfg.edit_layers)
    out["budget"] = budget
    return out


def run_systems(
    s: Setup, systems: tuple[str, ...] = SYSTEMS, keep: str | None = "zerounlearn"
) -> dict[str, Any]:
    """Metrics of every system in ``systems`` on this seed's facts; the model is restored
    between systems. ``keep``: the system whose edited weights are returned (for a checkpoint,
    on the CPU). The unedited weights are kept on the CPU (not a second copy on the GPU).
    ``instances[system]`` holds the per-forget-fact values behind the forget metrics
    (:func:`.evaluation.evaluate_instances`)."""
    cfg, model, tok = s.cfg, s.model, s.tok
    hp, _, _ = hparams(cfg)
    original = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    results: dict[str, dict[str, float]] = {}
    instances: dict[str, dict[str, list[float]]] = {}
    diags: dict[str, Any] = {}
    timings: dict[str, float] = {}
    kept: dict[str, torch.Tensor] | None = None
    prep: Prepared | None = None
    for system in systems:
        t0 = time.time()
        if system != "base":
            model.load_state_dict(original)
        if system in VARIANT_OF:
            if prep is None:
                tp = time.time()
                prep = prepare_edit(s)
                timings["prepare"] = time.time() - tp
                diags["prepare"] = prep.info
            diags[system] = apply_edit(model, tok, s.forget, prep, hp, VARIANT_OF[system])
            if system == keep:
                kept = edited_weights(model, cfg.edit_layers)
        elif system == "gradient_ascent":
            diags[system] = run_gradient_ascent(s)
        elif system == "finetune_neutral":
            diags[system] = finetune_neutral(
                model, tok, s.forget, cfg.edit_layers, cfg.ft_steps, cfg.ft_lr
            )
        elif system != "base":
            raise ValueError(f"unknown system {system!r}")
        results[system], instances[system] = evaluate_instances(model, tok, s.evalset)
        timings[system] = time.time() - t0
        print(
            f"[zerounlearn seed {s.seed}] {system}: "
            + " ".join(f"{k}={v:.4g}" for k, v in results[system].items())
            + f" ({timings[system]:.0f}s)",
            flush=True,
        )
    model.load_state_dict(original)
    return {
        "metrics": results,
        "instances": instances,
        "diagnostics": diags,
        "timings": timings,
        "kept": kept,
    }


def apply_checkpoint_weights(model: Any, weights: dict[str, torch.Tensor]) -> list[int]:
    return load_edited_weights(model, weights)
