"""Why does ReCoG's context graph not read its support? (the recog method's support probe)

    python examples/recog_support_probe.py --out support-probe.json     # small, 3 seeds
    python examples/recog_support_probe.py --preset smoke --seeds 1 \\
        --set steps=4 --set readout=support --set 'shots=[1,2]'         # seconds (tests)

With the support read-out (``readout=support``) a graph model's logit is the sum of two terms:
the head ``MLP([h_q; h_t])`` and the prototype term ``s · (cos(h_q, p₊) − cos(h_q, p₋))``, p±
the means of the positive and negative support molecules' final graph states. On `small` every
graph model moves by only 0.2–0.3 AUC points from 1 to 10 shots while ProtoNet on the same
encoder moves 5. This trains the reproduction's models (same config, seed and episodes as a
row of `nshot reproduce recog`) and, on the reproduction's evaluation episodes (every test
target, ``eval_draws`` support draws, the same draws for every model of a seed), scores the
queries with each part of the answer separately:

* ``full``: the model's logit (equals the reproduction's AUC for the preset's own regime);
* ``head``: ``MLP([h_q; h_t])`` alone;
* ``proto_graph``: the prototype term alone, on the final graph states (sign of s included);
* ``proto_graph_as_query``: the same prototypes, with the support molecules' states computed as
  the queries' are: the support passed again as queries, each copy without a
  molecule–molecule edge to itself (as the support molecule has none), so a copy's state
  differs from its support molecule's only by the missing edge to the target, which carries
  the molecule's own label;
* ``proto_encoder_cos`` / ``proto_encoder_euclid``: a cosine / a squared-Euclidean (ProtoNet's)
  prototype on the same trained model's encoder embeddings, before any message passing;

the learned scale s, the spread (std over an episode's queries) of the head and prototype
terms, the mean cosine between an episode's query states (final graph states and encoder
embeddings: how much the queries still differ) and the cosine between the positive and negative
prototypes (graph states, as-query states, encoder embeddings). ProtoNet is scored by its logit and by the encoder prototypes; a cosine prototype on the
raw ECFP bits (nothing trained) is the reference. Every model is trained twice: in the preset's
regime and in ``nodrop_k10`` (dropout 0, k = the largest of ``shots`` in every training
episode). AUC per episode → mean per target → mean over targets (the reproduction's
aggregation), per seed; the summary holds the means over seeds and the gain from the smallest
to the largest k. The run record (commit, clean tree or not, CPU seconds) is in ``run``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nshot.fileio import print_report

SYSTEMS = ("recog", "context_graph", "protonet")
SCORES_GRAPH = ("full", "head", "proto_graph", "proto_graph_as_query", "proto_encoder_cos",
                "proto_encoder_euclid")  # fmt: skip
SCORES_PROTONET = ("full", "proto_encoder_cos", "proto_encoder_euclid")


def cos_proto(hs: torch.Tensor, ys: torch.Tensor, hq: torch.Tensor) -> torch.Tensor:
    """cos(h_q, mean of the positive support) − cos(h_q, mean of the negative support)."""
    pos = hs[ys == 1].mean(0, keepdim=True)
    neg = hs[ys == 0].mean(0, keepdim=True)
    return F.cosine_similarity(hq, pos, dim=1) - F.cosine_similarity(hq, neg, dim=1)


def euclid_proto(hs: torch.Tensor, ys: torch.Tensor, hq: torch.Tensor) -> torch.Tensor:
    """ProtoNet's score: squared distance to the negative minus to the positive prototype."""
    pos, neg = hs[ys == 1].mean(0), hs[ys == 0].mean(0)
    return ((hq - neg) ** 2).sum(1) - ((hq - pos) ** 2).sum(1)


def mean_pair_cos(h: torch.Tensor) -> float:
    """Mean cosine similarity over the pairs of distinct rows of ``h``."""
    z = F.normalize(h, dim=1)
    n = len(z)
    return float(((z @ z.t()).sum() - n) / max(n * (n - 1), 1))


def proto_cos(hs: torch.Tensor, ys: torch.Tensor) -> float:
    """Cosine between the positive and the negative prototype."""
    pos, neg = hs[ys == 1].mean(0), hs[ys == 0].mean(0)
    return float(F.cosine_similarity(pos, neg, dim=0))


class Probe:
    """Runs a trained model on an episode and returns every score of the module docstring."""

    def __init__(self, model: torch.nn.Module) -> None:
        from nshot.methods.recog.model import RecogModel

        self.model = model.eval()
        self.graph = isinstance(model, RecogModel)
        self.cap: dict[str, torch.Tensor] = {}
        model.encoder.register_forward_hook(lambda m, i, o: self.cap.__setitem__("enc", o))
        if self.graph:
            if not model.support_readout:
                raise SystemExit("the probe reads the support read-out: --set readout=support")
            model.head.register_forward_hook(
                lambda m, i, o: self.cap.__setitem__("head", o.squeeze(-1))
            )
            original = model._prototype_logits

            def prototype_logits(h_s, ys, h_q):  # noqa: ANN001, ANN202
                self.cap["h_s"], self.cap["h_q"] = h_s, h_q
                out = original(h_s, ys, h_q)
                self.cap["proto"] = out
                return out

            model._prototype_logits = prototype_logits  # this instance only

            def no_self_edge(m, i, o):  # noqa: ANN001, ANN202
                # the support passed again as queries: copy j of support molecule j gets no
                # edge to itself, as support molecule j has none (its similarity → −∞)
                n = self.cap.get("copies")
                if n is None:
                    return o
                o = o.clone()
                o[torch.arange(n) + n, torch.arange(n)] = -1e9
                return o

            model.sim.register_forward_hook(no_self_edge)

    @torch.no_grad()
    def scores(self, ep) -> tuple[dict[str, np.ndarray], dict[str, float]]:  # noqa: ANN001
        from nshot.methods.recog.model import episode_tensors

        inp = episode_tensors(ep)
        S = inp["xs"].shape[0]
        ys = inp["ys"]
        self.cap.clear()
        out = self.model(**inp)
        enc = self.cap["enc"]
        sc = {"full": out.logits,
              "proto_encoder_cos": cos_proto(enc[:S], ys, enc[S:]),
              "proto_encoder_euclid": euclid_proto(enc[:S], ys, enc[S:])}  # fmt: skip
        spread: dict[str, float] = {}
        if self.graph:
            head, proto, h_q = self.cap["head"], self.cap["proto"], self.cap["h_q"]
            self.cap_support = self.cap["h_s"]
            if not torch.allclose(head + proto, out.logits, atol=1e-5):
                raise AssertionError("the logit is not head + prototype term")
            sc["head"], sc["proto_graph"] = head, proto
            # the support again, as queries: their states without the edge to the target
            again = {**inp, "xq": torch.cat([inp["xs"], inp["xq"]]),
                     "lq": torch.cat([inp["ls"], inp["lq"]]),
                     "smiles_q": inp["smiles_s"] + inp["smiles_q"]}  # fmt: skip
            self.cap.clear()
            self.cap["copies"] = S
            self.model(**again)
            states = self.cap["h_q"]
            self.cap.pop("copies")
            if not torch.allclose(states[S:], h_q, atol=1e-5):
                raise AssertionError("a query's state depends on the other queries")
            s = self.model.proto_scale
            sc["proto_graph_as_query"] = s * cos_proto(states[:S], ys, states[S:])
            spread = {
                "head": float(head.std()),
                "proto_graph": float(proto.std()),
                "cos_queries_graph": mean_pair_cos(h_q),
                "cos_queries_encoder": mean_pair_cos(enc[S:]),
                "cos_protos_graph": proto_cos(self.cap_support, ys),
                "cos_protos_as_query": proto_cos(states[:S], ys),
                "cos_protos_encoder": proto_cos(enc[:S], ys),
            }
        return {k: v.numpy() for k, v in sc.items()}, spread


def evaluate(probe: Probe, track, cfg, ks: list[int], seed: int) -> dict[str, Any]:  # noqa: ANN001
    """AUC of every score at every k (per episode → per target → mean over targets), and the
    mean spread of the two terms."""
    from nshot.methods.recog.evaluation import _auc, _target_mean, episodes_for

    res: dict[str, Any] = {"auc": {}, "spread": {}}
    for k in ks:
        per: dict[str, dict[int, list[float]]] = {}
        spreads: dict[str, list[float]] = {}
        for t, _, ep in episodes_for(track, cfg, k, seed):
            scores, spread = probe.scores(ep)
            for name, v in scores.items():
                per.setdefault(name, {}).setdefault(t, []).append(_auc(ep.yq, v))
            for name, v in spread.items():
                spreads.setdefault(name, []).append(v)
        for name, p in per.items():
            res["auc"].setdefault(name, {})[f"k{k}"] = _target_mean(p)
        for name, v in spreads.items():
            res["spread"].setdefault(name, {})[f"k{k}"] = float(np.mean(v))
    return res


def ecfp_reference(track, cfg, ks: list[int], seed: int) -> dict[str, float]:  # noqa: ANN001
    """A cosine prototype on the raw ECFP bits (nothing trained), on the same episodes."""
    from nshot.methods.recog.evaluation import _auc, _target_mean, episodes_for

    out = {}
    for k in ks:
        per: dict[int, list[float]] = {}
        for t, _, ep in episodes_for(track, cfg, k, seed):
            v = cos_proto(torch.from_numpy(ep.xs), torch.from_numpy(ep.ys), torch.from_numpy(ep.xq))
            per.setdefault(t, []).append(_auc(ep.yq, v.numpy()))
        out[f"k{k}"] = _target_mean(per)
    return out


def _mean(vals: list[float]) -> float | None:
    v = [x for x in vals if x is not None and not math.isnan(x)]
    return round(float(np.mean(v)), 4) if v else None


def summarise(models: dict[str, dict], ks: list[int]) -> dict[str, dict]:
    """Means over seeds, and each score's gain from the smallest to the largest k."""
    lo, hi = f"k{min(ks)}", f"k{max(ks)}"
    out = {}
    for key, m in models.items():
        row: dict[str, Any] = {"s": _mean(m["s"]) if m["s"] else None}
        for name, by_k in m["auc"].items():
            cell = {kk: _mean(v) for kk, v in by_k.items()}
            if lo != hi:
                gains = [b - a for a, b in zip(by_k[lo], by_k[hi])]
                cell["gain"] = _mean(gains)
            row[name] = cell
        for name, by_k in m["spread"].items():
            row[f"spread_{name}"] = {kk: _mean(v) for kk, v in by_k.items()}
        out[key] = row
    return out


def small_json_check(models: dict[str, dict], preset: str, overrides: dict, ks: list[int]):
    """For `small` with no override: the preset-regime models' ``full`` AUC per seed against
    the committed reproduction's per-seed samples (the same models: the largest difference)."""
    from nshot.provenance import method_results_dir

    path = method_results_dir("recog") / "small.json"
    if preset != "small" or overrides or not path.exists():
        return None
    samples = json.loads(path.read_text())["samples"]
    worst = 0.0
    for system in SYSTEMS:
        m = models.get(f"preset/{system}")
        if m is None:
            continue
        for k, metric in ((min(ks), "auc_1shot"), (max(ks), "auc_10shot")):
            ref = samples[system][metric][: len(m["auc"]["full"][f"k{k}"])]
            worst = max(worst, *(abs(a - b) for a, b in zip(m["auc"]["full"][f"k{k}"], ref)))
    return {"file": f"methods/recog/results/{path.name}", "max_abs_diff": worst}


def main() -> None:
    from nshot.method import get, parse_overrides
    from nshot.methods.recog.data import track_for
    from nshot.methods.recog.train import fit_model
    from nshot.provenance import git_state

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seeds", type=int, default=None, help="seeds (default: the preset's)")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--set", action="append", default=[], help="key=value config override")
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0, c0 = time.time(), time.process_time()
    git = git_state()
    overrides = parse_overrides(args.set)
    cfg = get("recog").config(args.preset, **overrides)
    ks = sorted({min(cfg.shots), max(cfg.shots)})
    regimes = {"preset": {}, "nodrop_k10": {"dropout": 0.0, "shots": [max(cfg.shots)]}}
    seeds = [cfg.seed + i for i in range(args.seeds or cfg.seeds)]
    track = track_for(cfg)
    models: dict[str, dict] = {}
    reference: dict[str, list[float]] = {}
    for seed in seeds:
        for kk, v in ecfp_reference(track, cfg, ks, seed).items():
            reference.setdefault(kk, []).append(v)
        for regime, change in regimes.items():
            for system in args.systems:
                t1 = time.process_time()
                train_cfg = cfg.replace(seed=seed, system=system, **change)
                model = fit_model(train_cfg, track, system)
                train_s = time.process_time() - t1
                probe = Probe(model)
                res = evaluate(probe, track, cfg, ks, seed)
                m = models.setdefault(f"{regime}/{system}",
                                      {"s": [], "auc": {}, "spread": {}, "cpu_s": []})  # fmt: skip
                if probe.graph:
                    m["s"].append(float(model.proto_scale.detach()))
                for name, by_k in res["auc"].items():
                    for kk, v in by_k.items():
                        m["auc"].setdefault(name, {}).setdefault(kk, []).append(v)
                for name, by_k in res["spread"].items():
                    for kk, v in by_k.items():
                        m["spread"].setdefault(name, {}).setdefault(kk, []).append(v)
                m["cpu_s"].append(round(time.process_time() - t1, 1))
                print(f"seed {seed} {regime}/{system}: trained in {train_s:.0f} s CPU; "
                      + ", ".join(f"{n} {by['k' + str(min(ks))]:.3f}→{by['k' + str(max(ks))]:.3f}"
                                  for n, by in res["auc"].items()), flush=True)  # fmt: skip
    report = {
        "probe": "recog support probe (examples/recog_support_probe.py)",
        "preset": args.preset,
        "overrides": overrides,
        "seeds": seeds,
        "eval_shots": ks,
        "steps": cfg.steps,
        "regimes": {
            r: {"dropout": c.get("dropout", cfg.dropout), "train_shots": c.get("shots", cfg.shots)}
            for r, c in regimes.items()
        },  # fmt: skip
        "summary": summarise(models, ks),
        "reference_ecfp_proto_cos": {kk: _mean(v) for kk, v in reference.items()},
        "per_seed": models,
        "small_json_check": small_json_check(models, args.preset, overrides, ks),
        "run": {
            "commit": git["commit"],
            "dirty": git["dirty"],
            "dirty_files": git["dirty_files"],
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "wall_s": round(time.time() - t0, 1),
            "cpu_s": round(time.process_time() - c0, 1),
            "command": " ".join(
                ["python examples/recog_support_probe.py", f"--preset {args.preset}"]
                + ([f"--seeds {args.seeds}"] if args.seeds else [])
                + [f"--systems {' '.join(args.systems)}"]
                + [f"--set '{s}'" for s in args.set]
            ),  # fmt: skip
        },
    }
    print_report(report, args.out)


if __name__ == "__main__":
    main()
