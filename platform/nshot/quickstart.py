"""`nshot quickstart`: TAIL trained, evaluated and served on an embedded local Ray.

1. starts a local single-node Ray (or joins ``RAY_ADDRESS``);
2. trains TAIL with the chosen preset on one Ray Train worker;
3. evaluates the checkpoint (held-out classes, unseen modalities, real digits/MNIST, 20-way)
   next to ProtoHead on the same episodes and prints the table;
4. serves the checkpoint's predictor and answers one few-shot request built from real
   scikit-learn digits images (classes 5-9, never seen in training).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def run(out: Path, preset: str = "small", console=None) -> dict:
    from rich.console import Console
    from rich.table import Table

    from nshot.method import get
    from nshot.train import Scaling, ensure_ray, fit, load_checkpoint

    console = console or Console()
    t0 = time.time()
    method = get("tail")
    cfg = method.config(preset, torch_threads=2)
    console.rule(f"[bold]nshot quickstart[/bold]: TAIL, preset {preset}")
    ensure_ray()
    console.print("1/3 training TAIL on the local Ray cluster (1 Ray Train worker)...")
    res = fit(
        "tail", cfg, scaling=Scaling(workers=1, cpus_per_worker=2), storage=out, name="tail-quickstart",
        overwrite=True,
    )  # fmt: skip
    console.print(f"    checkpoint: {res.checkpoint} ({res.wall_s:.0f}s)")

    console.print("2/3 evaluating on episodes the model never saw...")
    from nshot.methods.tail.evaluation import default_settings, evaluate_systems, tail_system
    from nshot.methods.tail.serve import TailPredictor

    ckpt = load_checkpoint(res.checkpoint, method="tail")
    predictor = TailPredictor.from_checkpoint(ckpt)
    settings = default_settings(include_text=False)
    episodes = min(cfg.eval_episodes, 200)
    results = evaluate_systems(
        {"tail": tail_system(predictor), "protohead": None}, settings, episodes=episodes, draws=2
    )
    table = Table(title=f"5-query episodes, {episodes} per setting (mean accuracy ± 95% CI)")
    table.add_column("setting")
    table.add_column("TAIL", justify="right")
    table.add_column("ProtoHead", justify="right")
    for s in settings:
        cells = []
        for system in ("tail", "protohead"):
            v = results[system].get(s.metric)
            cells.append("n/a" if v is None else f"{v[0]:.3f} ± {v[1]:.3f}")
        table.add_row(f"{s.metric} ({s.description})", *cells)
    console.print(table)

    console.print(
        "3/3 serving the checkpoint with Ray Serve on 127.0.0.1 and sending one request..."
    )
    answer, acc, url, same = _serve_one(method, ckpt)
    console.print(
        f"    POST {url}/predict (5-way 5-shot, real digits 5-9): labels {answer['labels'][:6]}...; "
        f"accuracy on 25 queries {acc:.2f}; first query: "
        + ", ".join(f"{k}: {v:.2f}" for k, v in answer["probs"][0].items())
        + f"; equals the in-process predictor: {same}"
    )
    console.print(f"[bold green]done[/bold green] in {time.time() - t0:.0f}s")
    return {"checkpoint": str(res.checkpoint), "results": results, "served_accuracy": acc}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_one(method, ckpt):
    """One HTTP request to the checkpoint served by nshot's Ray Serve app (then shut down)."""
    from ray import serve

    from nshot.data import digits_table, episode_from_table
    from nshot.serve import Client, start

    episode = episode_from_table(
        digits_table(), (5, 6, 7, 8, 9), shots=5, queries=5, label=lambda c: f"digit-{c}"
    )
    query_y = episode.pop("query_y")
    request = {**episode, "n_draws": 4}
    url = start("tail", ckpt.path, port=_free_port())
    try:
        answer = Client(url).predict(request)
    finally:
        serve.shutdown()
    predictor = method.predictor(ckpt)
    same = answer == predictor(predictor.Request(**request)).model_dump(mode="json")
    acc = float(np.mean([a == b for a, b in zip(answer["labels"], query_y)]))
    return answer, acc, url, same
