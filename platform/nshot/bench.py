"""Benchmarks: ratios measured in one run, written as JSON a later run can compare against.

``nshot bench train --method tail`` trains the same config with 1 and with 2 Ray Train
workers (one CPU and one torch thread each; the per-worker batch is fixed, so 2 workers
process twice the samples per step) and reports the group's samples/s and their ratio.
``nshot bench serve`` drives the Serve app with and without batching and a bare FastAPI app with
the predictor's own example request; ``nshot bench deepspeed`` measures ZeRO's memory per rank.
``nshot bench <method>`` runs the method's own benchmark
(:meth:`~nshot.method.Method.benchmark`, e.g. TAIL's inline against per-query inference), which
writes through :func:`write_result` like the others.
"""

from __future__ import annotations

import json
import os
import platform as _stdlib_platform
import tempfile
import time
from pathlib import Path
from typing import Any

from nshot.method import get


def _environment() -> dict[str, Any]:
    import ray
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "python": _stdlib_platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "machine": _stdlib_platform.machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_result(
    default: str, out: str | os.PathLike | None, data: dict[str, Any], keys: list[str]
) -> dict[str, Any]:
    """Write a benchmark's ``data`` as JSON to ``out`` (else ``default``), with the environment
    and its ratios to the previous file's figures ``keys``, and return it (with
    ``written_to``). A method's :meth:`~nshot.method.Method.benchmark` writes through it too."""
    data.setdefault("environment", _environment())
    path = Path(out or default)
    data["compared_to_previous"] = _compare(path, data, keys)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    data["written_to"] = str(path)
    return data


def _compare(out: Path, data: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """Ratios of this run's figures to the previous run's, when the file already exists."""
    if not out.exists():
        return {}
    try:
        old = json.loads(out.read_text())
    except (OSError, ValueError):
        return {}
    cmp = {}
    for k in keys:
        a, b = data.get(k), old.get(k)
        if isinstance(a, int | float) and isinstance(b, int | float) and b:
            cmp[k] = {"previous": b, "now": a, "now_over_previous": a / b}
    return cmp


def train(
    method_name: str = "tail",
    *,
    preset: str = "small",
    steps: int = 60,
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    from nshot.train import Scaling, ensure_ray, fit

    method = get(method_name)
    cfg = method.config(
        preset,
        steps=steps,
        log_every=max(1, steps // 6),
        checkpoint_every=steps,
        torch_threads=1,
    )
    ensure_ray()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nshot-bench-") as storage:
        for workers in (1, 2):
            res = fit(
                method_name,
                cfg,
                scaling=Scaling(workers=workers, cpus_per_worker=1),
                storage=storage,
                name=f"bench-{workers}w",
            )
            sps = res.metrics.get("samples_per_s")
            if sps is None:
                raise RuntimeError(f"{method_name} does not report samples_per_s")
            runs[f"workers_{workers}"] = {"samples_per_s": sps, "wall_s": res.wall_s}
    data: dict[str, Any] = {
        "benchmark": "train",
        "method": method_name,
        "preset": preset,
        "steps": steps,
        "torch_threads_per_worker": 1,
        "cpus_per_worker": 1,
        **runs,
        "samples_per_s_1": runs["workers_1"]["samples_per_s"],
        "samples_per_s_2": runs["workers_2"]["samples_per_s"],
        "ratio_2_over_1": runs["workers_2"]["samples_per_s"] / runs["workers_1"]["samples_per_s"],
        "target_ratio": 1.6,
        "environment": _environment(),
    }
    return write_result(
        f"bench-results/train-{method_name}.json",
        out,
        data,
        ["samples_per_s_1", "samples_per_s_2", "ratio_2_over_1"],
    )


# --------------------------------------------------------------------------- serve


def _load(url: str, payload: bytes, clients: int, requests: int, timeout_s: float = 60.0):
    """``requests`` POSTs from ``clients`` threads (bounded, loopback); latencies in seconds."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> float:
        t = time.perf_counter()
        req = urllib.request.Request(url, data=payload, method="POST")
        req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
        return time.perf_counter() - t

    for _ in range(min(clients, 4)):  # warm-up
        one(0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        lat = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - t0
    import numpy as np

    arr = np.asarray(lat)
    return {
        "requests": requests,
        "requests_per_s": requests / wall,
        "p50_ms": float(np.percentile(arr, 50) * 1000),
        "p99_ms": float(np.percentile(arr, 99) * 1000),
    }


def _wait_http(url: str, timeout_s: float = 120.0) -> None:
    import urllib.request

    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def serve(
    method_name: str = "tail",
    *,
    checkpoint: str | None = None,
    requests: int = 300,
    concurrency: tuple[int, ...] = (1, 8, 32),
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """(a) Serve with batching, (b) Serve without batching, (c) bare FastAPI/uvicorn, no Ray.

    Same predictor and checkpoint; each is driven with 1, 8 and 32 concurrent clients for a
    fixed number of requests on 127.0.0.1. Without ``checkpoint`` a `smoke` model is trained
    first (in-process)."""
    import socket
    import subprocess
    import sys

    from ray import serve as ray_serve

    from nshot.serve.app import ServeOptions, build_app
    from nshot.train import ensure_ray, fit

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    ensure_ray()
    tmp = tempfile.TemporaryDirectory(prefix="nshot-bench-serve-")
    if checkpoint is None:
        cfg = get(method_name).config("smoke")
        checkpoint = str(fit(method_name, cfg, storage=tmp.name, name="bench").checkpoint)
    payload = _bench_payload(method_name, checkpoint)
    port = free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    systems: dict[str, str] = {}
    for name, batch in (("serve_batched", 16), ("serve_unbatched", 1)):
        ray_serve.run(
            build_app(method_name, checkpoint, ServeOptions(max_batch_size=batch)),
            name=name,
            route_prefix=f"/{name}",
        )
        systems[name] = f"http://127.0.0.1:{port}/{name}/predict"
    bare_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nshot.serve.bare", "--method", method_name,
         "--checkpoint", checkpoint, "--port", str(bare_port)],
    )  # fmt: skip
    try:
        _wait_http(f"http://127.0.0.1:{bare_port}/{method_name}/healthz")
        systems["fastapi_bare"] = f"http://127.0.0.1:{bare_port}/{method_name}/predict"
        results: dict[str, dict[str, Any]] = {s: {} for s in systems}
        for c in concurrency:
            for s, url in systems.items():
                results[s][f"clients_{c}"] = _load(url, payload, c, requests)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        ray_serve.shutdown()
        tmp.cleanup()
    top, one = f"clients_{max(concurrency)}", f"clients_{min(concurrency)}"
    a, b, c_ = results["serve_batched"], results["serve_unbatched"], results["fastapi_bare"]
    data: dict[str, Any] = {
        "benchmark": "serve",
        "method": method_name,
        "requests_per_level": requests,
        "results": results,
        "throughput_a_over_b_top": a[top]["requests_per_s"] / b[top]["requests_per_s"],
        "throughput_a_over_c_top": a[top]["requests_per_s"] / c_[top]["requests_per_s"],
        "p50_b_over_c_one_client": b[one]["p50_ms"] / c_[one]["p50_ms"],
        "targets": {"throughput_a_over_b_top": ">= 3", "p50_b_over_c_one_client": "<= 1.5"},
        "environment": _environment(),
    }
    keys = ["throughput_a_over_b_top", "throughput_a_over_c_top", "p50_b_over_c_one_client"]
    return write_result(f"bench-results/serve-{method_name}.json", out, data, keys)


def _bench_payload(method_name: str, checkpoint: str) -> bytes:
    """A representative request: the served predictor's own example request."""
    from nshot.train import load_checkpoint

    predictor = get(method_name).predictor(load_checkpoint(checkpoint, method=method_name))
    example = predictor.example_request()
    if example is None:
        raise ValueError(f"{method_name}: its predictor publishes no example_request()")
    return json.dumps(example).encode()


# --------------------------------------------------------------------------- a method's own


def methods_with_benchmarks() -> list[str]:
    """The registered methods that implement :meth:`~nshot.method.Method.benchmark`."""
    from nshot.method import Method, available

    return [n for n in available() if type(get(n)).benchmark is not Method.benchmark]


def method(name: str, *, preset: str = "small", out: str | os.PathLike | None = None):
    """``nshot bench <method>``: the method's own benchmark, or a clear error naming the
    benchmarks there are."""
    from nshot.errors import NshotError, UnknownMethodError

    def choices() -> str:
        return ", ".join(["train", "serve", "deepspeed", *methods_with_benchmarks()])

    try:
        data = get(name).benchmark(preset=preset, out=None if out is None else str(out))
    except UnknownMethodError:
        raise NshotError(f"unknown benchmark {name!r}: choose one of {choices()}") from None
    if data is None:
        raise NshotError(f"{name} has no benchmark of its own: choose one of {choices()}")
    return data


# --------------------------------------------------------------------------- deepspeed


def _ds_memory_worker(config: dict[str, Any]) -> None:
    """Ray Train worker: build the engine, take two optimizer steps, write this rank's bytes."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    from nshot.nn.lm import tiny_llama_config
    from nshot.train.deepspeed import DeepSpeedOptions, build_engine, memory_report

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(config["vocab"], **config["shape"]))
    opts = DeepSpeedOptions(
        zero_stage=config["zero_stage"], micro_batch=1, lr=1e-4, precision=config["precision"]
    )
    engine = build_engine(model, opts)
    x = torch.randint(0, config["vocab"], (1, 32))
    for _ in range(2):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    report = memory_report(engine)
    report["n_params"] = float(
        sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    )
    rank = dist.get_rank()
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(report))


#: the shape of SmolLM2-135M (30 layers, hidden 576, MLP 1536, 9/3 heads), randomly initialised
SMOLLM2_SHAPE = {
    "layers": 30,
    "hidden": 576,
    "intermediate": 1536,
    "heads": 9,
    "kv_heads": 3,
    "max_positions": 2048,
}


def deepspeed(
    *,
    workers: int = 2,
    shape: str = "smollm2",
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Per-rank parameter + optimizer memory under ZeRO-0 and ZeRO-3 on ``workers`` Ray Train
    CPU workers, for fp32 (the CPU default) and bf16 mixed precision (the GPU default), and the
    ratios ZeRO-3 / ZeRO-0 (target <= 0.6)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from nshot.train import ensure_ray
    from nshot.train.runner import fit_trainer

    if shape == "smollm2":
        model_shape, vocab = SMOLLM2_SHAPE, 49152
    elif shape == "tiny":
        model_shape = {"layers": 4, "hidden": 128, "intermediate": 512, "heads": 4}
        vocab = 3000
    else:
        raise ValueError(f"unknown model shape {shape!r}: choose smollm2 or tiny")
    ensure_ray()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nshot-bench-ds-") as tmp:
        for precision in ("fp32", "bf16"):
            for stage in (0, 3):
                d = Path(tmp, f"{precision}-z{stage}")
                d.mkdir()
                cfg = {
                    "zero_stage": stage,
                    "precision": precision,
                    "vocab": vocab,
                    "shape": model_shape,
                    "out": str(d),
                }
                fit_trainer(
                    TorchTrainer(
                        _ds_memory_worker,
                        train_loop_config=cfg,
                        scaling_config=ray.train.ScalingConfig(
                            num_workers=workers, resources_per_worker={"CPU": 1}
                        ),
                        run_config=ray.train.RunConfig(
                            name=d.name, storage_path=str(Path(tmp, "ray"))
                        ),
                    )
                )
                ranks = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(workers)]
                runs[f"{precision}_zero{stage}"] = {
                    "per_rank_total_bytes": [r["total"] for r in ranks],
                    "per_rank": ranks,
                    "max_rank_total_mb": max(r["total"] for r in ranks) / 2**20,
                }
    data: dict[str, Any] = {
        "benchmark": "deepspeed",
        "workers": workers,
        "model_shape": shape,
        "n_params": runs["fp32_zero0"]["per_rank"][0]["n_params"],
        **runs,
        "ratio_zero3_over_zero0_fp32": runs["fp32_zero3"]["max_rank_total_mb"]
        / runs["fp32_zero0"]["max_rank_total_mb"],
        "ratio_zero3_over_zero0_bf16": runs["bf16_zero3"]["max_rank_total_mb"]
        / runs["bf16_zero0"]["max_rank_total_mb"],
        "target_ratio": 0.6,
        "what": "bytes of model parameters resident on a rank + fp32 master copies + Adam "
        "moments, after two optimizer steps (largest rank)",
        "environment": _environment(),
    }
    return write_result(
        f"bench-results/deepspeed-{shape}.json",
        out,
        data,
        ["ratio_zero3_over_zero0_fp32", "ratio_zero3_over_zero0_bf16"],
    )
