"""GPU check for nshot's LLM stack: the CUDA path, compared with the CPU result. No Ray needed.

Run it on a machine with one GPU (torch with CUDA, DeepSpeed, transformers installed)::

    python examples/gpu_check.py            # exit 0 when every check passes

It runs each check twice, on the GPU in this process and on the CPU in a subprocess (DeepSpeed
picks its accelerator once per process), and compares:

1. the DeepSpeed helper with ZeRO-3 on one GPU, bf16 (the GPU default) and fp32: the loss of a
   tiny Llama over 8 steps against the CPU fp32 run, and the gathered checkpoint reloaded into
   plain transformers giving the engine's logits;
2. ZeroUnlearn's core step: the closed-form multiplicative edit D = A B^-1 of one down_proj
   (float64 solve) on the GPU against the CPU, and the whole edit on a small model placed on
   the device as the method places it (``resolve_device``, the ``device`` config field): key
   statistics, δ targets, keys at the subject, ``apply_edit``, then the teacher-forced metrics;
3. keystone's core step: the activation probe's per-neuron strengths and the top-k neurons of a
   small model on the GPU against the CPU, a hooked masking forward pass, Δ rows (keystone SFT's
   parametrisation) created from the model on the device, and the capability evaluator.

4. every method (``gpu_check_methods.py``): its ``smoke`` preset trained through the platform's
   trainer on the GPU against the CPU (every report's metrics agree), and one step of its
   ``paper`` preset at full size with the peak GPU memory (``--methods a,b`` picks methods,
   ``--methods none`` skips them).

With a GPU it writes everything it measured to ``gpu-results/gpu_check.json`` (``--json``).
On a machine without a GPU it runs the CPU side only and says so (exit 0), which is how CI
keeps the script working.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # gpu_check_methods beside this file


def _tiny_model(seed: int = 0, vocab: int = 256):
    from transformers import LlamaForCausalLM

    from nshot.nn.lm import tiny_llama_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        tiny_llama_config(vocab, layers=2, hidden=64, intermediate=256, heads=4, max_positions=64)
    )


def _batch(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (4, 32), generator=g)


def check_deepspeed(device: str, precision: str, workdir: Path) -> dict:
    """Train the tiny model 8 steps under ZeRO-3; save, reload, compare logits."""
    from transformers import AutoModelForCausalLM

    from nshot.train.deepspeed import DeepSpeedOptions, build_engine, save_hf_model

    model = _tiny_model()
    engine = build_engine(
        model, DeepSpeedOptions(zero_stage=3, micro_batch=4, lr=1e-3, precision=precision)
    )
    x = _batch().to(engine.device)
    losses = []
    for _ in range(8):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.eval()
    with torch.no_grad():
        logits = engine(input_ids=x).logits.float().cpu()
    out = save_hf_model(engine, workdir / f"ckpt-{device}-{precision}")
    plain = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True)
    with torch.no_grad():
        reloaded = plain(input_ids=x.cpu()).logits.float()
    return {
        "losses": losses,
        "reload_max_abs_diff": float((reloaded - logits).abs().max()),
        "logits_mean": float(logits.mean()),
    }


def check_zerounlearn(device: str) -> dict:
    """The closed-form edit D = A B^-1 (float64 solve) for one random down_proj, as the method
    computes it (soft projector from the sensitive basis, combined statistics), on ``device``."""
    from nshot.methods.zerounlearn.edit import closed_form_d, sensitive_basis, soft_projector

    g = torch.Generator().manual_seed(3)
    d, m, n = 48, 96, 4
    w = torch.randn(d, m, generator=g, dtype=torch.float64)
    k_w = torch.randn(m, 500, generator=g, dtype=torch.float64)
    k_f = torch.randn(m, n, generator=g, dtype=torch.float64)
    v_f = torch.randn(d, n, generator=g, dtype=torch.float64)
    v_s = torch.randn(n, d, generator=g, dtype=torch.float64)
    w, k_w, k_f, v_f, v_s = (t.to(device) for t in (w, k_w, k_f, v_f, v_s))
    kkt = 15000.0 * k_w @ k_w.T / k_w.shape[1] + 50.0 * k_f @ k_f.T
    vkt = 15000.0 * w @ k_w @ k_w.T / k_w.shape[1] + 50.0 * v_f @ k_f.T
    p = soft_projector(sensitive_basis(v_s), 0.01)
    w_new = closed_form_d(w, kkt, vkt, p, 1.0) @ w
    return {
        "w_new": w_new.cpu().flatten()[:64].tolist(),
        "norm": float(w_new.norm()),
        **check_zerounlearn_edit(device),
    }


ZU_SUBJECTS = ("alpha", "beta", "gamma", "delta")
ZU_ANSWERS = ("red", "green", "blue", "north")


def check_zerounlearn_edit(device: str) -> dict:
    """The method's own edit steps on a small random model on ``device``: every tensor they
    make follows the model's parameters, statistics and the float64 algebra included."""
    from nshot.methods.zerounlearn import edit as E
    from nshot.methods.zerounlearn.evaluation import perplexity
    from nshot.nn.lm import resolve_device
    from nshot.nn.tinylm import build_tokenizer

    texts = [f"the capital of {s} is {a} ." for s, a in zip(ZU_SUBJECTS, ZU_ANSWERS)]
    texts += ["because people speak of the city and you know it is a country ."] * 4
    tok = build_tokenizer(texts)
    model = _tiny_model(seed=7, vocab=len(tok)).to(resolve_device(device)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    reqs = [
        E.EditRequest("the capital of {} is", s, a, (), "capital")
        for s, a in zip(ZU_SUBJECTS, ZU_ANSWERS)
    ]
    stats = E.key_statistics(model, tok, texts * 20, [0], 1000, use_cache=False)
    hp = E.EditHParams(layers=(0,), lam_w=15000.0)
    prep = E.prepare(model, tok, reqs, ["{}"], stats, hp, E.DeltaHParams(steps=5), 1)
    w0 = E.mlp(model, 0).down_proj.weight.detach().double().cpu()
    diag = E.apply_edit(model, tok, reqs, prep, hp, "zerounlearn")
    w1 = E.edited_weights(model, [0])["layers.0.down_proj"].double()
    ppl = perplexity(model, tok, [E.encode(tok, t) for t in texts])
    return {
        "edit_param_device": str(E.mlp(model, 0).down_proj.weight.device),
        "edit_stats_device": str(stats[0].kk_sum.device),
        "edit_change": (w1 - w0).flatten()[:64].tolist(),
        "edit_change_norm": float((w1 - w0).norm()),
        "edit_ortho_ratio": diag["layers"][0]["ortho_ratio"],
        "edit_ppl": ppl,
    }


def check_keystone(device: str) -> dict:
    """Stage 1 of the probe (mean |activation| over greedily generated tokens, with hooks) and a
    masked forward pass (the top-10 neurons zeroed) on a small model, on ``device``."""
    import numpy as np

    from nshot.methods.keystone.neurons import NeuronHooks, NeuronSpace
    from nshot.methods.keystone.probe import activation_strengths
    from nshot.nn.tinylm import build_tokenizer

    prompts = [
        "the capital of alpha is red",
        "one plus two is three",
        "def f ( x ) : return x",
        "la capitale de alpha est rouge",
    ]
    tok = build_tokenizer(prompts)
    model = _tiny_model(seed=5, vocab=len(tok)).to(device).eval()
    space = NeuronSpace(model)
    s, _ = activation_strengths(model, tok, space, prompts, tokens=8, chat=False)
    top = [int(i) for i in np.argsort(-s.mean(0), kind="stable")[:10]]
    x = _batch().remainder(len(tok)).to(device)
    with torch.no_grad(), NeuronHooks(space, scale=(top, 0.0)):
        masked = model(input_ids=x).logits.float().cpu()
    # Δ rows built from the model on the device (as keystone SFT and the predictor build them)
    from nshot.methods.keystone.evaluation import Evaluator
    from nshot.methods.keystone.neurons import DeltaRows

    delta = DeltaRows(space, top)
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for p in delta.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        with NeuronHooks(space, delta=delta):
            shifted = model(input_ids=x).logits.float().cpu()
    texts = [" ".join(prompts), " ".join(reversed(prompts))]
    ev = Evaluator(tok, {"facts": [(p, "x") for p in prompts]}, texts, ppl_tokens=32)
    return {
        "top": top,
        "masked_logits_mean": float(masked.mean()),
        "delta_device": str(next(delta.parameters()).device),
        "delta_logits_mean": float(shifted.mean()),
        "ppl": ev(model)["ppl"],
    }


def run(device: str, workdir: Path, methods: str = "all") -> dict:
    from nshot.nn.lm import resolve_device

    os.environ["DS_ACCELERATOR"] = "cuda" if device == "cuda" else "cpu"
    result: dict = {"device": str(resolve_device(device))}
    result["deepspeed_fp32"] = check_deepspeed(device, "fp32", workdir)
    if device == "cuda":
        result["deepspeed_bf16"] = check_deepspeed(device, "bf16", workdir)
    result["zerounlearn"] = check_zerounlearn(device)
    result["keystone"] = check_keystone(device)
    if methods != "none":
        sys.path.insert(0, str(Path(__file__).parent))
        import gpu_check_methods

        from nshot.train.tinylm import ensure_tiny_lm

        ensure_tiny_lm("smoke")  # the LLM methods' smoke preset reads it
        names = None if methods == "all" else methods.split(",")
        result["methods"] = gpu_check_methods.run(device, names)
    return result


def compare(gpu: dict, cpu: dict) -> list[tuple[str, bool, str]]:
    rows = []
    a, b = gpu["deepspeed_fp32"]["losses"], cpu["deepspeed_fp32"]["losses"]
    d = max(abs(x - y) for x, y in zip(a, b, strict=True))
    rows.append(("ZeRO-3 fp32 loss, GPU vs CPU (8 steps)", d < 1e-3, f"max diff {d:.2e}"))
    a16 = gpu["deepspeed_bf16"]["losses"]
    d16 = max(abs(x - y) / abs(y) for x, y in zip(a16, b, strict=True))
    rows.append(("ZeRO-3 bf16 loss vs CPU fp32 (relative)", d16 < 3e-2, f"max rel diff {d16:.2e}"))
    for k in ("deepspeed_fp32", "deepspeed_bf16"):
        r = gpu[k]["reload_max_abs_diff"]
        rows.append((f"{k} checkpoint reload logits", r < 2e-2, f"max abs diff {r:.2e}"))
    wz = torch.tensor(gpu["zerounlearn"]["w_new"]) - torch.tensor(cpu["zerounlearn"]["w_new"])
    rows.append(
        ("ZeroUnlearn closed form, GPU vs CPU", wz.abs().max() < 1e-6, f"{wz.abs().max():.2e}")
    )
    zg, zc = gpu["zerounlearn"], cpu["zerounlearn"]
    placed = zg["edit_param_device"].startswith("cuda") and zg["edit_stats_device"].startswith(
        "cuda"
    )
    rows.append(
        (
            "ZeroUnlearn edit runs on the GPU (weights, key statistics)",
            placed,
            f"{zg['edit_param_device']}, {zg['edit_stats_device']}",
        )
    )
    dz = torch.tensor(zg["edit_change"]) - torch.tensor(zc["edit_change"])
    rel = float(dz.norm() / torch.tensor(zc["edit_change"]).norm().clamp_min(1e-30))
    rows.append(("ZeroUnlearn edit ΔW, GPU vs CPU (relative)", rel < 1e-2, f"{rel:.2e}"))
    rn = abs(zg["edit_change_norm"] - zc["edit_change_norm"]) / max(zc["edit_change_norm"], 1e-30)
    rows.append(("ZeroUnlearn edit ‖ΔW‖, GPU vs CPU (relative)", rn < 1e-3, f"{rn:.2e}"))
    dp = abs(zg["edit_ppl"] - zc["edit_ppl"]) / zc["edit_ppl"]
    rows.append(("ZeroUnlearn perplexity after the edit, GPU vs CPU", dp < 1e-3, f"{dp:.2e}"))
    kg, kc = gpu["keystone"], cpu["keystone"]
    same = kg["top"] == kc["top"]
    rows.append(("keystone top-10 neurons, GPU vs CPU", same, f"{kg['top']}"))
    dm = abs(kg["masked_logits_mean"] - kc["masked_logits_mean"])
    rows.append(("keystone masked forward, GPU vs CPU", dm < 1e-3, f"diff {dm:.2e}"))
    on_gpu = kg["delta_device"].startswith("cuda")
    rows.append(("keystone Δ rows created on the GPU", on_gpu, kg["delta_device"]))
    dd = abs(kg["delta_logits_mean"] - kc["delta_logits_mean"])
    rows.append(("keystone Δ-rows forward, GPU vs CPU", dd < 1e-3, f"diff {dd:.2e}"))
    dk = abs(kg["ppl"] - kc["ppl"]) / kc["ppl"]
    rows.append(("keystone evaluator perplexity, GPU vs CPU (relative)", dk < 1e-3, f"{dk:.2e}"))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--side", choices=["cpu", "cuda"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--methods", default="all", help="all (default), none, or a comma-separated list"
    )
    p.add_argument(
        "--json",
        default="gpu-results/gpu_check.json",
        help="where a GPU run writes what it measured (default gpu-results/gpu_check.json)",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="nshot-gpu-check-") as tmp:
        workdir = Path(tmp)
        if args.side is not None:  # one side, in a fresh process
            Path(args.out).write_text(json.dumps(run(args.side, workdir, args.methods)))
            return 0
        cpu_json = workdir / "cpu.json"
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
        side = [sys.executable, __file__, "--methods", args.methods, "--side"]
        subprocess.run([*side, "cpu", "--out", str(cpu_json)], check=True, env=env)
        cpu = json.loads(cpu_json.read_text())
        print(
            f"CPU side: ZeRO-3 fp32 losses {[round(x, 4) for x in cpu['deepspeed_fp32']['losses']]}"
        )
        if not torch.cuda.is_available():
            print("no CUDA device visible: ran the CPU side only")
            return 0
        gpu_json = workdir / "gpu.json"
        subprocess.run([*side, "cuda", "--out", str(gpu_json)], check=True)
        gpu = json.loads(gpu_json.read_text())
        print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        rows = compare(gpu, cpu)
        if "methods" in gpu:
            import gpu_check_methods

            rows += gpu_check_methods.compare(gpu["methods"], cpu["methods"])
        ok = True
        for name, passed, detail in rows:
            ok &= bool(passed)
            print(f"{'PASS' if passed else 'FAIL'}  {name}: {detail}")
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "checks": [{"check": n, "passed": bool(p), "detail": d} for n, p, d in rows],
            "gpu_side": gpu,
            "cpu_side": cpu,
        }
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
