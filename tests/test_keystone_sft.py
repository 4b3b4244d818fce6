"""keystone's one-GPU-machine SFT example (`examples/keystone_sft.py`) end to end on the tiny LM,
with Ray unimportable (a module of its own: it needs no Ray, so it runs beside the Ray tests)."""

from __future__ import annotations


def test_keystone_sft_example_runs_without_ray(tiny_smoke_lm, tmp_path) -> None:
    """examples/keystone_sft.py (the one-GPU-machine SFT comparison) end to end on the tiny LM,
    in a fresh process with Ray unimportable: three systems, the three `sft_*` claims."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    block = tmp_path / "noray"
    (block / "ray").mkdir(parents=True)
    (block / "ray" / "__init__.py").write_text("raise ImportError('ray is blocked in this test')")
    out = tmp_path / "sft.json"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(block), os.environ.get("PYTHONPATH", "")])
    )
    # in-process DeepSpeed tests leave this process's one-rank group in the environment (its
    # port is still bound here): the child makes its own, as a fresh shell would
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, str(root / "examples" / "keystone_sft.py"), "--preset", "smoke",
         "--set", "sft_steps=2", "--set", "sft_batch=4", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = res["summary"]["rows"]
    assert set(rows) == {"sft_full", "sft_keystone", "sft_random_rows"}
    assert rows["sft_keystone"]["trainable_params"] < rows["sft_full"]["trainable_params"]
    assert [c["id"] for c in res["summary"]["claims"]] == [
        "sft_keystone_matches_full",
        "sft_keystone_forgets_less",
        "sft_keystone_beats_random_rows",
    ]
    assert res["config"]["sft_steps"] == 2
    assert "sft_keystone_matches_full" in proc.stdout  # the claims, stated per line
    bad = subprocess.run(
        [sys.executable, str(root / "examples" / "keystone_sft.py"), "--set", "oops"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0 and "key=value" in bad.stderr
