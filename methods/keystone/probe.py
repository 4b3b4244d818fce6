"""Keystone probing: Stage 1 (multi-prompt activation probe), Stage 2 (masking frontier), the
masking controls, the calibration probe and the stability probe.

Stage 1 greedy-generates ``probe_tokens`` tokens for each of the K = 4 prompts of a prompt group
(one per capability) in one left-padded batch, with :class:`~.neurons.NeuronHooks` recording
running sums of ``|a|`` per neuron and prompt over the **generated** tokens only (the forward
passes that feed one new token per row; the prompt's prefill pass is excluded). Then::

    T_k(B) = top-ρ fraction of block B by s_k
    C      = ∩_k ∪_B T_k(B)
    S[n]   = mean_k s_k[n] / mean_{n' ∈ B(n)} s_k[n']
    rank C by S, descending

Stage 2 zeroes growing prefixes of the ranking (``mask_grid``, capped at ``max_fraction`` of all
neurons) and stops at the first prefix whose aggregate accuracy is ≤ ``collapse_acc`` × base or
whose perplexity is ≥ ``collapse_ppl`` × base: that prefix is K*. If no prefix collapses, K* is
the largest prefix tried and ``collapsed`` is False (reported as such, never hidden).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nshot.nn.lm import pad_token_id

from .neurons import NeuronHooks, NeuronSpace

# --------------------------------------------------------------------------- probe prompts

# five disjoint groups, one prompt per capability (general, math, code, multilingual)
NATURAL_GROUPS: tuple[tuple[str, str, str, str], ...] = (
    (
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "What is 17 + 25? Explain the addition step by step.",
        "Write a Python function that reverses a string and explain how it works.",
        "Écris un court paragraphe sur la ville de Paris et ses monuments.",
    ),
    (
        "Describe how bread is made, from flour to the finished loaf.",
        "Compute 8 * 12 and show your reasoning.",
        "Write a Python function that returns the factorial of n.",
        "Raconte une petite histoire sur un chat qui aime la musique.",
    ),
    (
        "Explain why the sky is blue during the day and red at sunset.",
        "A train travels 60 km per hour for 3 hours. How far does it go? Show the steps.",
        "Write Python code that counts how many times each word appears in a sentence.",
        "Explique comment on prépare une omelette aux champignons.",
    ),
    (
        "Tell me about the history of the bicycle.",
        "Solve the equation 3x + 5 = 20 step by step.",
        "Write a Python function that checks whether a number is prime.",
        "Décris ta journée idéale à la campagne.",
    ),
    (
        "Describe a walk through a forest in autumn.",
        "What is 144 divided by 12? Explain the division.",
        "Write a Python loop that prints the even numbers from 1 to 20.",
        "Quelle est la différence entre le printemps et l'automne ? Réponds en français.",
    ),
)


def tiny_groups(n_groups: int = 5) -> list[tuple[str, str, str, str]]:
    """Probe prompts for the tiny LMs, from their own domains (docstring text, arithmetic, code
    expressions, French fact prompts); group g takes disjoint items."""
    from nshot.data.lmtext import french_prompt, general_text, synthetic_facts

    texts = general_text("train")
    facts = synthetic_facts()
    groups = []
    for g in range(n_groups):
        words = texts[37 * g + 3].split()[:12]
        groups.append(
            (
                " ".join(words),
                f"{g + 2} + {7 - g} = {9} . {g + 3} * {2} =",
                f"max ( {g} , {9 - g} ) = {max(g, 9 - g)} . len ( [ {g} , {g + 1} ] ) =",
                french_prompt(facts[300 + g]),
            )
        )
    return groups


def prompt_groups(kind: str, n_groups: int) -> list[tuple[str, ...]]:
    if kind == "natural":
        if n_groups > len(NATURAL_GROUPS):
            raise ValueError(f"stability_groups: at most {len(NATURAL_GROUPS)} natural groups")
        return list(NATURAL_GROUPS[:n_groups])
    return tiny_groups(n_groups)[:n_groups]


# --------------------------------------------------------------------------- stage 1


def _encode_prompts(tok, prompts: Sequence[str], chat: bool) -> dict[str, torch.Tensor]:
    from .evaluation import encode

    seqs = []
    for p in prompts:
        if chat:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            seqs.append(list(ids))
        else:
            seqs.append(encode(tok, p))
    pad = pad_token_id(tok)
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):  # left padding for generation
        ids[i, L - len(s) :] = torch.tensor(s)
        mask[i, L - len(s) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def activation_strengths(
    model, tok, space: NeuronSpace, prompts: Sequence[str], tokens: int, chat: bool
) -> tuple[np.ndarray, list[str]]:
    """``s[k, n]``: mean ``|a_n|`` over the generated tokens of prompt k (greedy), and the
    generated texts. Only decode passes (one new token per row) are recorded."""
    dev = next(model.parameters()).device
    batch = {k: v.to(dev) for k, v in _encode_prompts(tok, prompts, chat).items()}
    hooks = NeuronHooks(space, record=True)

    def pre(_mod, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        hooks.recording = ids is not None and ids.shape[-1] == 1

    handle = model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with hooks:
            out = model.generate(
                **batch,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=pad_token_id(tok),
            )
    finally:
        handle.remove()
    texts = tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return hooks.mean_abs(), texts


def candidates(space: NeuronSpace, s: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1's candidate pool C (ranked by S, descending) and S for every neuron."""
    K = s.shape[0]
    in_top = np.ones(space.total, dtype=bool)
    strength = np.zeros(space.total)
    for k in range(K):
        top_k = np.zeros(space.total, dtype=bool)
        for b in range(len(space.blocks)):
            lo, hi = int(space.offsets[b]), int(space.offsets[b + 1])
            vals = s[k, lo:hi]
            n_top = max(1, int(round(rho * (hi - lo))))
            top_k[lo + np.argpartition(-vals, n_top - 1)[:n_top]] = True
            strength[lo:hi] += vals / max(vals.mean(), 1e-12)
        in_top &= top_k
    strength /= K
    pool = np.flatnonzero(in_top)
    pool = pool[np.argsort(-strength[pool], kind="stable")]
    return pool, strength


# --------------------------------------------------------------------------- stage 2


Evaluate = Callable[[dict[int, float] | None], dict[str, float]]


def make_evaluate(model, space: NeuronSpace, evaluator) -> Evaluate:
    """``evaluate(scale)``: the evaluator's metrics with ``scale`` (``{gid: r}``) applied."""

    def evaluate(scale: dict[int, float] | None) -> dict[str, float]:
        if not scale:
            return evaluator(model)
        with NeuronHooks(space, scale=scale):
            return evaluator(model)

    return evaluate


def zero(gids: Sequence[int]) -> dict[int, float]:
    return dict.fromkeys((int(g) for g in gids), 0.0)


def is_collapsed(
    m: dict[str, float], base: dict[str, float], acc_frac: float, ppl_x: float
) -> bool:
    return m["acc"] <= acc_frac * base["acc"] or m["ppl"] >= ppl_x * base["ppl"]


@dataclass
class Frontier:
    keystones: list[int]  # K*, ranked
    collapsed: bool
    curve: list[dict[str, float]] = field(default_factory=list)  # {"n": N, metrics...}


def frontier(
    evaluate: Evaluate,
    ranked: Sequence[int],
    base: dict[str, float],
    grid: Sequence[int],
    max_n: int,
    acc_frac: float,
    ppl_x: float,
    log: Callable[[str], None] = print,
) -> Frontier:
    """Stage 2: zero growing prefixes of ``ranked``; K* is the first prefix that collapses."""
    sizes = sorted({min(int(n), len(ranked), max_n) for n in grid if n >= 1})
    curve = []
    for n in sizes:
        m = evaluate(zero(ranked[:n]))
        curve.append({"n": float(n), **m})
        log(f"  mask top-{n}: acc {m['acc']:.3f} ppl {m['ppl']:.4g}")
        if is_collapsed(m, base, acc_frac, ppl_x):
            return Frontier(list(map(int, ranked[:n])), True, curve)
    n = sizes[-1] if sizes else 0
    return Frontier(list(map(int, ranked[:n])), False, curve)


# --------------------------------------------------------------------------- controls


def random_set(space: NeuronSpace, n: int, rng: np.random.Generator, exclude=()) -> list[int]:
    """Uniformly random neurons (control 1)."""
    excl = set(map(int, exclude))
    out: list[int] = []
    while len(out) < n:
        g = int(rng.integers(space.total))
        if g not in excl:
            excl.add(g)
            out.append(g)
    return out


def norm_set(space: NeuronSpace, n: int, exclude=()) -> list[int]:
    """The n neurons with the largest ``‖W[j, :]‖₂`` (control 2)."""
    norms = space.row_norms()
    norms[list(map(int, exclude))] = -np.inf
    return list(map(int, np.argsort(-norms, kind="stable")[:n]))


def module_matched_set(
    space: NeuronSpace, keys: Sequence[int], rng: np.random.Generator, same_layer: bool = False
) -> list[int]:
    """Random neurons with the same module-type histogram as ``keys`` (control 3), or with the
    same (layer, module) for every keystone (control 4, ``same_layer=True``). Keystones excluded."""
    taken = set(map(int, keys))
    out = []
    for g in keys:
        b = int(space.block_id[g])
        if same_layer:
            blocks = [b]
        else:
            mod = space.blocks[b][1]
            blocks = [i for i, (_, m) in enumerate(space.blocks) if m == mod]
        while True:
            bb = blocks[int(rng.integers(len(blocks)))]
            c = int(space.offsets[bb] + rng.integers(space.widths[bb]))
            if c not in taken:
                taken.add(c)
                out.append(c)
                break
    return out


def iou(a: Sequence[int], b: Sequence[int]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / max(len(sa | sb), 1)


# --------------------------------------------------------------------------- full probe


@dataclass
class ProbeResult:
    """Everything the probe measured on one model (JSON-able via :meth:`to_json`)."""

    space: dict[str, Any]
    keystones: list[dict[str, Any]]
    collapsed: bool
    base: dict[str, float]
    curve: list[dict[str, float]]
    pool_size: int
    rows: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    calibration: dict[str, dict[str, float]] = field(default_factory=dict)
    stability: dict[str, Any] = field(default_factory=dict)
    items: dict[str, Any] = field(default_factory=dict)
    generated: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def keystone_records(space: NeuronSpace, gids: Sequence[int], strength: np.ndarray) -> list[dict]:
    out = []
    for g in gids:
        n = space.neuron(int(g))
        out.append(
            {"layer": n.layer, "module": n.module, "index": n.index, "strength": float(strength[g])}
        )
    return out


def run_probe(
    model,
    tok,
    space: NeuronSpace,
    evaluator,
    cfg,
    *,
    controls: bool = True,
    calibration: bool = True,
    stability: bool = True,
    log: Callable[[str], None] = print,
) -> ProbeResult:
    """Stages 1–2 on prompt group 0, then the controls, calibration and stability probes.

    ``cfg`` is a :class:`~.config.KeystoneConfig`. ``rows["keystone_off"]`` holds one run per
    prompt group (group 0's K* first, then each stability group's own K*) and, with the
    controls, ``rows["norm_off"]`` as many of the largest-norm neurons per group, paired with
    it; the random controls and the calibration use group 0's K*.
    """
    t0 = time.time()
    timings: dict[str, float] = {}
    kind = cfg.prompt_kind()
    groups = prompt_groups(kind, max(1, cfg.stability_groups if stability else 1))
    chat = cfg.use_chat(tok)
    plain = make_evaluate(model, space, evaluator)
    count = [0]

    def evaluate(scale: dict[int, float] | None) -> dict[str, float]:
        t = time.time()
        m = plain(scale)
        count[0] += 1
        log(f"  eval {count[0]}: acc {m['acc']:.3f} ppl {m['ppl']:.4g} ({time.time() - t:.0f}s)")
        return m

    base = evaluate(None)
    log(f"base: acc {base['acc']:.3f} ppl {base['ppl']:.4g} ({evaluator.n_items} items)")
    max_n = max(1, int(cfg.max_fraction * space.total))

    def stage12(group: Sequence[str]) -> tuple[Frontier, np.ndarray, int, list[str]]:
        s, texts = activation_strengths(model, tok, space, group, cfg.probe_tokens, chat)
        pool, strength = candidates(space, s, cfg.rho)
        log(f"stage 1: candidate pool {len(pool)} of {space.total} neurons")
        fr = frontier(
            evaluate, pool, base, cfg.mask_grid, max_n, cfg.collapse_acc, cfg.collapse_ppl, log
        )
        return fr, strength, len(pool), texts

    fr, strength, pool_size, texts = stage12(groups[0])
    timings["stage12_s"] = time.time() - t0
    keys = fr.keystones
    log(f"K*: {len(keys)} neurons, collapsed={fr.collapsed}")
    res = ProbeResult(
        space=space.describe(),
        keystones=keystone_records(space, keys, strength),
        collapsed=fr.collapsed,
        base=base,
        curve=fr.curve,
        pool_size=pool_size,
        generated=texts,
    )
    n = len(keys)
    res.rows["full"] = [base]
    off = fr.curve[-1] if fr.curve else evaluate(zero(keys))
    res.rows["keystone_off"] = [{**{k: v for k, v in off.items() if k != "n"}, "n_neurons": n}]
    if controls and n:
        t = time.time()
        rng = np.random.default_rng([cfg.seed, 1])
        draws = cfg.control_draws
        extra = cfg.extra_control_draws
        res.rows["random_module_off"] = [
            evaluate(zero(module_matched_set(space, keys, rng))) for _ in range(draws)
        ]
        res.rows["random_off"] = [
            evaluate(zero(random_set(space, n, rng, keys))) for _ in range(extra)
        ]
        res.rows["random_samelayer_off"] = [
            evaluate(zero(module_matched_set(space, keys, rng, same_layer=True)))
            for _ in range(extra)
        ]
        res.rows["norm_off"] = [{**evaluate(zero(norm_set(space, n, keys))), "n_neurons": n}]
        timings["controls_s"] = time.time() - t
        for name in ("random_off", "random_module_off", "random_samelayer_off", "norm_off"):
            accs = [m["acc"] for m in res.rows[name]]
            log(f"{name}: acc {np.mean(accs):.3f} (base {base['acc']:.3f})")
    if calibration and n:
        t = time.time()
        rng = np.random.default_rng([cfg.seed, 2])
        rand = module_matched_set(space, keys, rng)
        for r in cfg.calib_grid:
            mk = evaluate(dict.fromkeys(keys, float(r)))
            mr = evaluate(dict.fromkeys(rand, float(r)))
            res.calibration[f"{r:g}"] = {
                "acc_keystone": mk["acc"],
                "acc_random": mr["acc"],
                "ppl_keystone": mk["ppl"],
                "ppl_random": mr["ppl"],
                "calib_drop_keystone": base["acc"] - mk["acc"],
                "calib_drop_random": base["acc"] - mr["acc"],
            }
            log(f"calibration r={r:g}: keystone acc {mk['acc']:.3f}, random acc {mr['acc']:.3f}")
        timings["calibration_s"] = time.time() - t
    if stability and len(groups) > 1:
        t = time.time()
        sets = [keys]
        for g in groups[1:]:
            fr_g, _, _, _ = stage12(g)
            sets.append(fr_g.keystones)
            log(f"stability group: |K*|={len(fr_g.keystones)} collapsed={fr_g.collapsed}")
            n_g = len(fr_g.keystones)
            if n_g and n:  # this group's K* zeroed (its frontier's last point), and as many of
                # the largest-norm neurons: the two rows' replicates, paired by prompt group
                off_g = {k: v for k, v in fr_g.curve[-1].items() if k != "n"}
                res.rows["keystone_off"].append({**off_g, "n_neurons": n_g})
                if "norm_off" in res.rows:
                    norm_g = evaluate(zero(norm_set(space, n_g, fr_g.keystones)))
                    res.rows["norm_off"].append({**norm_g, "n_neurons": n_g})
        pairs = [
            (i, j, iou(sets[i], sets[j])) for i in range(len(sets)) for j in range(i + 1, len(sets))
        ]
        res.stability = {
            "groups": len(sets),
            "sizes": [len(s) for s in sets],
            "iou": {f"{i}-{j}": v for i, j, v in pairs},
            "iou_mean": float(np.mean([v for _, _, v in pairs])),
            "iou_chance": float(np.mean([len(s) for s in sets]) / space.total),
            "sets": [list(map(int, s)) for s in sets],
        }
        timings["stability_s"] = time.time() - t
        log(f"stability: IoU {res.stability['iou_mean']:.3f}")
    timings["total_s"] = time.time() - t0
    res.timings = timings
    return res


def probe_model(source: str, cfg, log: Callable[[str], None] | None = None, **kwargs: Any):
    """Load ``source``, build its evaluator and run :func:`run_probe`:
    ``(model, tok, space, evaluator, result)``."""
    from .evaluation import build_evaluator
    from .model import load_model
    from .model import log as default_log

    log = log or default_log
    model, tok = load_model(source, cfg)
    space = NeuronSpace(model, cfg.modules)
    log(f"{source}: {space.describe()}")
    ev, info = build_evaluator(model, tok, source, cfg)
    res = run_probe(model, tok, space, ev, cfg, log=log, **kwargs)
    res.items = info
    return model, tok, space, ev, res
