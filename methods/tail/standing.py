"""What ``nshot quickstart`` says beside its table: what the model it just trained is, and where
the long-trained ``small`` model stands, read at run time from the committed
``results/small.json`` (no figure is written here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import TailConfig

RESULTS = Path(__file__).parent / "results" / "small.json"
REPRODUCE = "nshot reproduce tail --preset small"

# the comparison's settings in words (the metrics of evaluation.SETTINGS)
SETTING_WORDS = {
    "acc_seen_5w5s": "held-out classes",
    "acc_unseen_modality_5w5s": "unseen modality B",
    "acc_audio_5w5s": "audio",
    "acc_digits_5w5s": "digits",
    "acc_mnist_5w5s": "MNIST",
    "acc_text_5w5s": "text",
    "acc_20way": "20-way",
}


def _tasks(cfg: TailConfig | dict[str, Any]) -> str:
    tasks = cfg["train_tasks"] if isinstance(cfg, dict) else cfg.train_tasks
    return "modality A only" if tasks == "A" else "modality A and generated mixed tasks"


def model_line(cfg: TailConfig) -> str:
    """The model the quickstart trained, in one sentence."""
    what = "a 3-minute model: " if cfg.preset == "quickstart" else ""
    return (
        f"This is {what}TAIL ({cfg.depth} blocks, d_data {cfg.d_data}) trained for "
        f"{cfg.steps:,} steps on {_tasks(cfg)} (preset {cfg.preset}), answering with "
        f"{cfg.eval_draws} (π, ρ) draws. The paper's TAIL has 16 blocks and trains for 100,000 "
        "steps; a model trained this briefly is not expected to beat ProtoHead, so the table "
        "shows the pipeline working (train, evaluate, serve), not where TAIL stands."
    )


def long_trained_lines(path: Path | str = RESULTS) -> list[str]:
    """Where the long-trained ``small`` model stands, from its committed results: TAIL minus
    each baseline per setting (mean over training seeds), where it is ahead of both, the
    verdicts of the paper's comparisons and of the served-model check. When the file is
    missing or was made with another recipe than the current ``small`` preset, says so."""
    small = TailConfig.PRESETS["small"]
    recipe = (
        f"`small`: {small['steps']:,} steps on {_tasks(small)}, "
        f"{small['experiment_seeds']} training seeds"
    )
    path = Path(path)
    if not path.is_file():
        return [
            f"The long-trained model ({recipe}) has no results in this install ({path}); "
            f"`{REPRODUCE}` makes them (about an hour on 2 cores)."
        ]
    data = json.loads(path.read_text())
    recorded = (data.get("run") or {}).get("config") or {}
    if any(recorded.get(k) != v for k, v in small.items()):
        steps = f"{recorded['steps']:,} steps, " if "steps" in recorded else ""
        return [
            f"The long-trained model ({recipe}) is not yet re-made: {path.name} holds an earlier "
            f"recipe ({steps}{data.get('seeds')} training seed(s)). `{REPRODUCE}` makes it "
            "(about an hour on 2 cores)."
        ]
    rows = data["rows"]
    tail, ph, lp = rows["tail"], rows["protohead"], rows["linear_probe"]
    parts: list[str] = []
    ahead: dict[str, list[str]] = {"ProtoHead": [], "LinearProbe": [], "neither": []}
    for metric, words in SETTING_WORDS.items():
        if None in (tail.get(metric), ph.get(metric), lp.get(metric)):
            continue
        d_ph, d_lp = (tail[metric] - ph[metric]) * 100, (tail[metric] - lp[metric]) * 100
        parts.append(f"{words} {d_ph:+.1f} / {d_lp:+.1f}")
        ahead["ProtoHead"] += [words] if d_ph > 0 else []
        ahead["LinearProbe"] += [words] if d_lp > 0 else []
        ahead["neither"] += [words] if max(d_ph, d_lp) <= 0 else []
    run = data.get("run") or {}
    made = f"made {run.get('date', '?')} at {str(run.get('commit', '?'))[:7]}"
    lines = [
        f"The long-trained model ({recipe}; {path.name}, {made}), TAIL minus ProtoHead / "
        f"minus LinearProbe, points: {', '.join(parts)}.",
        "Where TAIL wins (mean over seeds): ahead of ProtoHead on "
        f"{', '.join(ahead['ProtoHead']) or 'none'}; ahead of LinearProbe on "
        f"{', '.join(ahead['LinearProbe']) or 'none'}; behind both on "
        f"{', '.join(ahead['neither']) or 'none'}.",
    ]
    lines += _claim_lines(data)
    return lines


def _claim_lines(data: dict[str, Any]) -> list[str]:
    """The paper's comparisons (headline claims, paired over seeds) and the served-model
    check, re-evaluated on ``data`` with the declared claims."""
    from nshot.claims import VERDICT_WORDS, evaluate

    from .claims import CLAIMS

    out = []
    for c in evaluate(CLAIMS, data):
        if not c.get("applies", True):
            continue
        if c["kind"] != "headline" and c["id"] != "served_within_1pt_of_nearest_centroid":
            continue
        p = f", paired p {c['p']:.2g}" if c.get("p") is not None else ""
        statement = c["statement"].removesuffix(" (paired over training seeds).").rstrip(".")
        out.append(f"{statement}: {VERDICT_WORDS[c['holds']]}{p}.")
    return out
