"""`nshot quickstart`: a method (TAIL by default) trained, evaluated and served on a local Ray.

1. starts a local single-node Ray (or joins ``RAY_ADDRESS``);
2. trains the method with the chosen preset on one Ray Train worker;
3. runs the method's :meth:`~nshot.method.Method.quick_evaluation` on the checkpoint (for TAIL:
   held-out classes, unseen modalities, real digits/MNIST and 20-way episodes, next to
   ProtoHead on the same episodes) and prints its table, then the lines of its
   ``extra["summary"]`` when it has them (for TAIL: that the quickstart's model is a 3-minute
   model, and where the long-trained ``small`` model stands, from its committed results);
4. serves the checkpoint with Ray Serve and sends the predictor's own
   :meth:`~nshot.method.Predictor.example_request` over HTTP (for TAIL: a 5-way 5-shot episode
   of real scikit-learn digits, classes 5-9, never seen in training), checking that the
   answer equals the in-process predictor's.

Only the Method contract is used, so any registered method runs the same way.
"""

from __future__ import annotations

import json
import time
from itertools import groupby
from pathlib import Path
from typing import Any

from nshot.method import ResultsTable


def run(out: Path, preset: str = "quickstart", console=None, method_name: str = "tail") -> dict:
    from rich.console import Console

    from nshot.method import get
    from nshot.train import Scaling, ensure_ray, fit, load_checkpoint

    console = console or Console()
    t0 = time.time()
    method = get(method_name)
    cfg = method.config(preset, torch_threads=2)
    title = method.paper.split(":")[0] if ":" in method.paper else method.name
    console.rule(f"[bold]nshot quickstart[/bold]: {title}, preset {preset}")
    ensure_ray()
    console.print(f"1/3 training {title} on the local Ray cluster (1 Ray Train worker)...")
    res = fit(
        method_name, cfg, scaling=Scaling(workers=1, cpus_per_worker=2), storage=out,
        name=f"{method_name}-quickstart", overwrite=True,
    )  # fmt: skip
    console.print(f"    checkpoint: {res.checkpoint} ({res.wall_s:.0f}s)")

    console.print("2/3 evaluating on cases the model never saw...")
    ckpt = load_checkpoint(res.checkpoint, method=method_name)
    table = method.quick_evaluation(ckpt, cfg)
    console.print(results_table(table))
    for note in table.notes:
        console.print(f"    {note}", style="dim", markup=False)
    summary = table.extra.get("summary") or []
    if summary:
        console.print("    What this shows:")
    for line in summary:
        console.print(f"    - {line}", markup=False)

    console.print(
        "3/3 serving the checkpoint with Ray Serve on 127.0.0.1 and sending one request..."
    )
    served = _serve_one(method, ckpt)
    console.print(  # plain text: the summaries hold brackets that are not rich markup
        f"    POST {served['url']}/predict with the predictor's example request "
        f"({summarize(served['request'])})",
        markup=False,
    )
    console.print(
        f"    answer: {summarize(served['answer'])}; equals the in-process predictor: "
        f"{served['same']}",
        markup=False,
    )
    console.print(f"[bold green]done[/bold green] in {time.time() - t0:.0f}s")
    return {
        "checkpoint": str(res.checkpoint),
        "results": table.to_json(),
        "served_answer": served["answer"],
        "served_equals_in_process": served["same"],
    }


def results_table(table: ResultsTable):
    """A rich table of a :class:`ResultsTable`: one row per metric, one column per system,
    mean ± spread (the spread the method states in its notes)."""
    from rich.table import Table

    out = Table(title=f"{table.method}: quick evaluation (preset {table.preset})")
    out.add_column("metric")
    for system in table.rows:
        out.add_column(system, justify="right")
    for metric, higher in table.metrics.items():
        cells = []
        for system, row in table.rows.items():
            v, sd = row.get(metric), table.stds.get(system, {}).get(metric)
            cells.append(
                "n/a" if v is None else f"{v:.3f}" + ("" if sd is None else f" ± {sd:.3f}")
            )
        out.add_row(f"{metric} {'↑' if higher else '↓'}", *cells)
    return out


def summarize(body: Any, width: int = 8) -> str:
    """A one-line view of a JSON body: list shapes for matrices, runs of equal values for
    label lists (``digit-5 ×5, digit-6 ×5``), the first item of a list of objects."""
    if not isinstance(body, dict):
        return _short(body, width)
    return "; ".join(f"{k}: {_short(v, width)}" for k, v in body.items() if v is not None)


def _short(v: Any, width: int) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        items = list(v.items())
        text = ", ".join(f"{k}: {_short(x, width)}" for k, x in items[:width])
        return "{" + text + (", …" if len(items) > width else "") + "}"
    if not isinstance(v, list):
        return json.dumps(v)
    if v and all(isinstance(x, list) for x in v):
        inner = {len(x) for x in v}
        return f"[{len(v)}×{inner.pop()}]" if len(inner) == 1 else f"[{len(v)} rows]"
    if v and all(isinstance(x, dict) for x in v):
        return f"[{len(v)}], first {_short(v[0], width)}"
    runs = [(x, len(list(g))) for x, g in groupby(v)]
    if len(runs) < len(v):  # labels: runs of equal values
        parts = [_short(x, width) + (f" ×{n}" if n > 1 else "") for x, n in runs[:width]]
        return "[" + ", ".join(parts) + (", …" if len(runs) > width else "") + "]"
    parts = [_short(x, width) for x in v[:width]]
    return "[" + ", ".join(parts) + (f", … ({len(v)})" if len(v) > width else "") + "]"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_one(method, ckpt) -> dict[str, Any]:
    """The predictor's example request over HTTP to the checkpoint served by nshot's Ray Serve
    app (then shut down), and whether the answer equals the in-process predictor's."""
    from ray import serve

    from nshot.errors import NshotError
    from nshot.serve import Client, start

    predictor = method.predictor(ckpt)
    request = predictor.example_request()
    if request is None:
        raise NshotError(f"{method.name}: its predictor publishes no example_request()")
    url = start(method.name, ckpt.path, port=_free_port())
    try:
        answer = Client(url).predict(request)
    finally:
        serve.shutdown()
    local = predictor(predictor.Request.model_validate(request))
    same = answer == json.loads(local.model_dump_json())
    return {"url": url, "request": request, "answer": answer, "same": same}
