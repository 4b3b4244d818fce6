"""examples/recog_support_probe.py at toy size: it trains every probed system in both regimes,
splits each graph model's answer into its head and prototype terms, and writes its report with
the run record."""

from __future__ import annotations

import json
import math


def test_support_probe_runs_at_toy_size(tmp_path, run_example, capsys):
    out = tmp_path / "probe.json"
    run_example("recog_support_probe", ["--preset", "smoke", "--seeds", "1", "--set", "steps=3",
                                        "--set", "readout=support", "--set", "shots=[1,2]",
                                        "--out", str(out)])  # fmt: skip
    capsys.readouterr()
    report = json.loads(out.read_text())
    assert report["eval_shots"] == [1, 2] and report["seeds"] == [0]
    assert report["regimes"]["nodrop_k10"] == {"dropout": 0.0, "train_shots": [2]}
    summary = report["summary"]
    assert set(summary) == {f"{r}/{s}" for r in ("preset", "nodrop_k10")
                            for s in ("recog", "context_graph", "protonet")}  # fmt: skip
    graph = summary["preset/context_graph"]
    for score in ("full", "head", "proto_graph", "proto_graph_as_query", "proto_encoder_cos",
                  "proto_encoder_euclid"):  # fmt: skip
        assert 0.0 <= graph[score]["k1"] <= 1.0 and math.isfinite(graph[score]["gain"])
    assert math.isfinite(graph["s"]) and graph["spread_head"]["k2"] >= 0.0
    assert -1.0 <= graph["spread_cos_protos_as_query"]["k1"] <= 1.0
    assert summary["preset/protonet"]["s"] is None and "head" not in summary["preset/protonet"]
    assert 0.0 <= report["reference_ecfp_proto_cos"]["k2"] <= 1.0
    assert report["small_json_check"] is None  # only for `small` without overrides
    assert report["run"]["commit"] and "--preset smoke" in report["run"]["command"]
