"""What `nshot quickstart` and `nshot bench tail` take from TAIL through the Method contract:
the quick evaluation's table, the predictor's example request, the method's own benchmark."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from nshot.method import ResultsTable, get
from nshot.quickstart import results_table, summarize
from nshot.train.checkpoint import load_checkpoint


def _text(renderable) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(renderable)
    return out.getvalue()


def test_quick_evaluation_is_tail_next_to_protohead(untrained_tail_checkpoint):
    tail = get("tail")
    ckpt = load_checkpoint(untrained_tail_checkpoint, method="tail")
    cfg = tail.config("smoke", eval_episodes=10)
    table = tail.quick_evaluation(ckpt, cfg)
    assert isinstance(table, ResultsTable) and list(table.rows) == ["tail", "protohead"]
    metrics = {"acc_seen_5w5s", "acc_unseen_modality_5w5s", "acc_digits_5w5s", "acc_20way"}
    assert metrics <= set(table.metrics) and "acc_text_5w5s" not in table.metrics
    for system in table.rows:
        for m in table.metrics:
            assert 0.0 <= table.rows[system][m] <= 1.0 and table.stds[system][m] >= 0.0
    assert table.rows["protohead"]["acc_digits_5w5s"] > 0.5  # the baseline on real digits
    text = _text(results_table(table))
    assert "acc_digits_5w5s ↑" in text and "protohead" in text and " ± " in text
    assert any("95 % confidence interval" in n for n in table.notes)


def test_the_quickstart_says_what_its_model_is_and_where_small_stands(tmp_path):
    """Beside its table the quickstart says that its model is a 3-minute model and where the
    long-trained `small` stands, read from `small`'s results at run time: no file, a file of an
    earlier recipe ("not yet re-made"), or a re-made one (TAIL minus each baseline, where it
    wins, the paper's comparisons and the served-model check with their verdicts)."""
    from nshot.methods.tail.config import TailConfig
    from nshot.methods.tail.standing import long_trained_lines, model_line

    line = model_line(TailConfig.from_preset("quickstart"))
    assert line.startswith("This is a 3-minute model: TAIL") and "1,500 steps" in line
    assert "modality A only" in line and "not where TAIL stands" in line
    (missing,) = long_trained_lines(tmp_path / "small.json")
    assert "no results" in missing and "nshot reproduce tail --preset small" in missing

    small = TailConfig.from_preset("small").model_dump(mode="json")
    v1 = TailConfig.from_preset("small-v1").model_dump(mode="json")
    metrics = ("acc_seen_5w5s", "acc_unseen_modality_5w5s", "acc_20way")
    rows = {
        "tail": dict(zip(metrics, (0.990, 0.950, 0.940))),
        "protohead": dict(zip(metrics, (0.985, 0.934, 0.952))),
        "linear_probe": dict(zip(metrics, (0.991, 0.948, 0.969))),
        "nearest_centroid": {f"acc_width{w}": 0.8 for w in (16, 64, 256, 1024, 4096)},
    }
    rows["tail"].update({f"acc_width{w}": 0.795 for w in (16, 64, 256, 1024, 4096)})
    samples = {
        name: {m: [v - 0.003, v, v + 0.004] for m, v in r.items()} for name, r in rows.items()
    }
    path = tmp_path / "small.json"
    results = {"method": "tail", "preset": "small", "seeds": 3, "rows": rows, "samples": samples}
    path.write_text(json.dumps({**results, "run": {"config": v1}}))
    (earlier,) = long_trained_lines(path)
    assert "not yet re-made" in earlier and "1,500 steps, 3 training seed(s)" in earlier

    path.write_text(json.dumps({**results, "run": {"config": small, "commit": "abc1234def"}}))
    text = "\n".join(long_trained_lines(path))
    assert "24,000 steps on modality A and generated mixed tasks, 3 training seeds" in text
    assert "abc1234" in text and "held-out classes +0.5 / -0.1" in text
    assert "unseen modality B +1.6 / +0.2" in text and "20-way -1.2 / -2.9" in text
    assert "ahead of ProtoHead on held-out classes, unseen modality B;" in text
    assert "ahead of LinearProbe on unseen modality B;" in text and "behind both on 20-way" in text
    assert "TAIL is more accurate than LinearProbe" in text and "fails, paired p" in text
    assert "On the unseen modality B, TAIL is more accurate than ProtoHead" in text
    assert "within 1 point of nearest centroid" in text and text.endswith("holds.")


def test_the_served_example_reads_in_one_line(untrained_tail_checkpoint):
    pred = get("tail").predictor(load_checkpoint(untrained_tail_checkpoint, method="tail"))
    example = pred.example_request()
    line = summarize(example)
    assert "support_x: [25×64]" in line and "digit-5 ×5, digit-6 ×5" in line
    answer = json.loads(pred(pred.Request.model_validate(example)).model_dump_json())
    line = summarize(answer)
    assert line.startswith("labels: [") and "probs: [25], first {" in line
    assert "n_classes: 5" in line


def test_bench_tail_runs_through_the_method(tmp_path, capsys):
    from nshot.cli import main

    out = tmp_path / "tail.json"
    assert main(["bench", "tail", "--preset", "smoke", "--out", str(out), "--json"]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "tail_inference" and data["ways"] == 100
    assert data["max_abs_logit_diff"] < 1e-4 and data["speedup_inline"] > 1.0
    assert "environment" in data and data["compared_to_previous"] == {}
    capsys.readouterr()
    assert main(["bench", "tail", "--preset", "smoke", "--out", str(out), "--json"]) == 0
    again = json.loads(out.read_text())
    assert set(again["compared_to_previous"]) == {"inline_s", "per_query_s", "speedup_inline"}


@pytest.mark.parametrize(
    "what, message",
    [
        ("nope", "unknown benchmark 'nope': choose one of train, serve, deepspeed, "),
        ("caos", "caos has no benchmark of its own: choose one of train, serve, deepspeed, "),
    ],
)
def test_bench_of_something_else_is_one_error_line(what, message, capsys):
    from nshot.cli import main

    assert main(["bench", what]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"nshot: error: {message}") and "tail" in err[0]


@pytest.mark.ray
def test_quickstart_trains_evaluates_and_serves_at_smoke(ray_session, tmp_path):
    """`nshot quickstart --preset smoke` end to end (about 40 s on 2 cores): one Ray Train
    worker, the quick evaluation's table, the example request over HTTP through Ray Serve."""
    from nshot.quickstart import run

    out = io.StringIO()
    res = run(tmp_path, preset="smoke", console=Console(file=out, width=200))
    text = out.getvalue()
    assert "1/3 training TAIL" in text and "tail: quick evaluation (preset smoke)" in text
    assert "acc_digits_5w5s ↑" in text and "acc_digits_5w5s: scikit-learn digits" in text
    assert "What this shows:" in text and "This is TAIL (1 blocks" in text
    assert "The long-trained model (`small`: 24,000 steps" in text
    assert "support_y: [digit-5 ×5, digit-6 ×5" in text and "n_classes: 5" in text
    assert "equals the in-process predictor: True" in text
    assert res["served_equals_in_process"] is True
    assert list(res["results"]["rows"]) == ["tail", "protohead"]
    assert res["checkpoint"].endswith("checkpoint_00000050")
