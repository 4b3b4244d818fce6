"""ZeroUnlearn's edit (the paper's closed-form re-mapping and its GD variant), model-agnostic.

Works on any Hugging Face decoder whose blocks expose ``mlp.down_proj`` (Llama, Qwen, Mistral,
...). The pieces, in the order the edit uses them:

* :func:`context_templates`: step 1, the bare ``"{}"`` plus sampled 10-token continuations.
* :func:`optimise_targets`: the δ optimisation of steps 2 and 4, batched over requests (each
  request owns one row of δ; the summed loss with per-element Adam is the same as one run per
  request). Positions before the subject's last token do not depend on δ, so their key/value
  cache is computed once and every iteration runs only the suffix from the subject's last token.
* :func:`collect_at_subject`: keys (down_proj inputs), down_proj outputs and layer outputs at the
  subject's last token, template-averaged.
* :func:`key_statistics`: general-text second moments of the down_proj keys (cached).
* :func:`closed_form_d`: the multiplicative update ``D = A B⁻¹`` of step 6 (float64).
* :func:`apply_edit`: the sequential edit over the edited layers for the variants ``zerounlearn``
  (closed form), ``gd`` (ZeroUnlearn-GD), ``wo_op`` (P = I) and ``wo_ut`` (λ_w = 0), and the two
  editing baselines of the paper's main table on the same keys, targets and residual spreading:
  ``memit`` (:func:`memit_update`) and ``alphaedit`` (:func:`alphaedit_update`).

Device: everything runs where the model's parameters are (:func:`~nshot.nn.lm.model_device`):
token batches, hook captures, the δ offsets, the key-statistics accumulators and the float64
algebra of the edit (projector, ``D = A B⁻¹``, null space). Statistics are cached on the CPU and
loaded onto the model's device; :func:`edited_weights` returns CPU tensors (for checkpoints).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from nshot.nn.lm import (
    decoder_layers,
    encode,
    encode_pair,
    mlp,
    model_device,
    pad_token_id,
)

CONTEXT_PREFIXES = ("The", "Therefore", "Because", "I", "You")
KL_PROMPT = "{} is a"


class StopForward(Exception):
    """Raised by a hook to end a forward pass once the needed layer has run."""


@dataclass(frozen=True)
class EditRequest:
    """One fact to forget: rewrite template (with ``{}``), subject, true answer, paraphrases."""

    template: str
    subject: str
    answer: str
    paraphrases: tuple[str, ...] = ()
    relation: str = ""

    def prompt(self, template: str | None = None) -> str:
        return fill(template or self.template, self.subject)

    def to_json(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "subject": self.subject,
            "answer": self.answer,
            "paraphrases": list(self.paraphrases),
            "relation": self.relation,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EditRequest:
        return cls(d["template"], d["subject"], d["answer"], tuple(d["paraphrases"]), d["relation"])


def fill(template: str, subject: str) -> str:
    """``template`` with its first ``{}`` replaced by ``subject`` (no other brace handling)."""
    return template.replace("{}", subject, 1)


# --------------------------------------------------------------------------------------------
# tokenisation (the ids themselves: nshot.nn.lm.encode / encode_pair / pad_token_id)


def neutral_id(tok: Any) -> int:
    """The neutral target: the tokenizer's EOS token (a literal ``<|endoftext|>`` is several pieces on some tokenizers)."""
    if tok.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token to use as the neutral target")
    return int(tok.eos_token_id)


def subject_prompt(tok: Any, template: str, subject: str) -> tuple[list[int], int]:
    """Token ids of ``template`` filled with ``subject`` and the index of the subject's last token."""
    ids = encode(tok, fill(template, subject))
    head = encode(tok, template.split("{}", 1)[0] + subject)
    return ids, min(len(head), len(ids)) - 1


# --------------------------------------------------------------------------------------------
# hooks


def _output_tensor(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _replace_output(out: Any, new: torch.Tensor) -> Any:
    if isinstance(out, tuple):
        return (new, *out[1:])
    return new


def _module(model: Any, layer: int, site: str) -> torch.nn.Module:
    """``site`` ``"mlp"``: down_proj of ``layer`` (output edited); ``"layer"``: the whole block."""
    if site == "mlp":
        return mlp(model, layer).down_proj
    if site == "layer":
        return decoder_layers(model)[layer]
    raise ValueError(f"unknown hook site {site!r}")


def _batch(
    rows: Sequence[Sequence[int]], pad: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and attention mask (built on the CPU, then moved to ``device``)."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return ids, mask


# --------------------------------------------------------------------------------------------
# step 1: context templates


@torch.no_grad()
def context_templates(
    model: Any, tok: Any, n_sampled: int, seed: int, length: int = 10
) -> list[str]:
    """``["{}"]`` plus ``n_sampled`` top-k (k = 5) continuations of the five prefixes, each
    turned into ``"<continuation>. {}"`` (braces removed from the sampled text)."""
    out = ["{}"]
    if n_sampled <= 0:
        return out
    gen = torch.Generator().manual_seed(seed)  # a CPU generator: the same draws on any device
    prefixes = [CONTEXT_PREFIXES[i % len(CONTEXT_PREFIXES)] for i in range(n_sampled)]
    head = model.get_output_embeddings()
    dev = model_device(model)
    for prefix in prefixes:
        ids = encode(tok, prefix)
        start = len(ids)
        for _ in range(length):
            x = torch.tensor([ids], device=dev)
            h = model.model(input_ids=x).last_hidden_state[0, -1]
            logits = head(h)
            top = logits.topk(5)
            probs = torch.softmax(top.values, -1).cpu()
            ids.append(int(top.indices.cpu()[torch.multinomial(probs, 1, generator=gen)]))
        text = prefix + tok.decode(ids[start:], skip_special_tokens=True)
        text = " ".join(text.replace("{", " ").replace("}", " ").split())
        out.append(text + ". {}")
    return out


def template_types(templates: Sequence[str]) -> list[int]:
    """Type 0: the bare template; type 1: sampled contexts (averaged per type, then across)."""
    return [0 if t == "{}" else 1 for t in templates]


# --------------------------------------------------------------------------------------------
# keys and outputs at the subject's last token


@torch.no_grad()
def collect_at_subject(
    model: Any,
    tok: Any,
    requests: Sequence[EditRequest],
    templates: Sequence[str],
    layer: int,
    what: str,
    batch_size: int = 256,
) -> torch.Tensor:
    """``[N, dim]`` template-averaged vectors at the subject's last token of each request's
    rewrite prompt inside each context template. ``what``: ``"key"`` (down_proj input),
    ``"value"`` (down_proj output) or ``"layer"`` (residual output of block ``layer``).
    Float64, on the model's device."""
    dev = model_device(model)
    rows, pos, owner, ttype = [], [], [], []
    types = template_types(templates)
    for i, r in enumerate(requests):
        for t, ctx in enumerate(templates):
            ids, s = subject_prompt(tok, fill(ctx, r.template), r.subject)
            rows.append(ids[: s + 1])  # later tokens cannot change the subject's last position
            pos.append(s)
            owner.append(i)
            ttype.append(types[t])
    site = "layer" if what == "layer" else "mlp"
    module = _module(model, layer, site)
    captured: list[torch.Tensor] = []
    cur_pos: list[torch.Tensor] = []

    def hook(mod: Any, args: Any, out: Any) -> None:
        x = args[0] if what == "key" else _output_tensor(out)
        captured.append(x[torch.arange(x.shape[0], device=x.device), cur_pos[0]].detach().double())
        raise StopForward

    handle = module.register_forward_hook(hook)
    try:
        for b in range(0, len(rows), batch_size):
            ids, mask = _batch(rows[b : b + batch_size], pad_token_id(tok), dev)
            cur_pos[:] = [torch.tensor(pos[b : b + batch_size], device=dev)]
            try:
                model.model(input_ids=ids, attention_mask=mask)
            except StopForward:
                pass
    finally:
        handle.remove()
    vecs = torch.cat(captured)
    owner_t, type_t = torch.tensor(owner, device=dev), torch.tensor(ttype, device=dev)
    out = torch.zeros(len(requests), vecs.shape[1], dtype=torch.float64, device=dev)
    for i in range(len(requests)):
        means = [
            vecs[(owner_t == i) & (type_t == ty)].mean(0)
            for ty in sorted(set(ttype))
            if ((owner_t == i) & (type_t == ty)).any()
        ]
        out[i] = torch.stack(means).mean(0)
    return out


# --------------------------------------------------------------------------------------------
# steps 2 and 4: δ optimisation


@dataclass
class DeltaHParams:
    steps: int = 25
    lr: float = 0.1
    weight_decay: float = 0.5
    clamp: float = 0.75
    kl_factor: float = 0.0625
    stop_loss: float = 0.05


@dataclass
class Targets:
    z: torch.Tensor  # [N, d] float64: h0 + δ
    h0: torch.Tensor  # [N, d]
    iterations: int
    final_loss: list[float] = field(default_factory=list)
    final_nll: list[float] = field(default_factory=list)


def optimise_targets(
    model: Any,
    tok: Any,
    requests: Sequence[EditRequest],
    templates: Sequence[str],
    targets: Sequence[Sequence[int]],
    *,
    layer: int,
    site: str,
    loss_layer: int,
    hp: DeltaHParams,
) -> Targets:
    """Optimise one additive offset δ_i per request at the subject's last token so that the
    model emits ``targets[i]`` (token ids) after the rewrite prompt in every context template.

    ``site="mlp"``: δ is added to the down_proj output of ``layer`` (sensitive representations
    V_s, step 2); ``site="layer"``: to the residual output of block ``layer`` (remapping
    targets, step 4). Logits come from the output of block ``max(loss_layer, layer)`` through
    the final norm and the LM head. Requests whose loss falls below ``hp.stop_loss`` stop (their
    δ is frozen); the last iteration only evaluates.
    """
    n = len(requests)
    dev = model_device(model)
    loss_layer = max(loss_layer, layer)
    # rows: n * len(templates) answer rows, then n KL rows ("{subject} is a")
    seqs, starts, loss_pos, loss_tgt, owner = [], [], [], [], []
    for i, r in enumerate(requests):
        tgt = list(targets[i])
        for ctx in templates:
            ids, s = subject_prompt(tok, fill(ctx, r.template), r.subject)
            seqs.append(ids + tgt[:-1])
            starts.append(s)
            loss_pos.append([len(ids) - 1 + t for t in range(len(tgt))])
            loss_tgt.append(tgt)
            owner.append(i)
    n_main = len(seqs)
    for r in requests:
        ids, s = subject_prompt(tok, KL_PROMPT, r.subject)
        seqs.append(ids)
        starts.append(s)
    n_ctx = len(templates)
    bare_row = [i * n_ctx + templates.index("{}") for i in range(n)]
    pad = pad_token_id(tok)
    # prefix (positions before the subject's last token): fixed, computed once
    prefix = [s_[:st] for s_, st in zip(seqs, starts)]
    suffix = [s_[st:] for s_, st in zip(seqs, starts)]
    plen = torch.tensor([len(p) for p in prefix], device=dev)
    P = int(plen.max())
    cache = None
    if P > 0:
        # right-padded; the pads attend like real tokens here (finite values) and are masked
        # out for the suffix below
        pids, _ = _batch(prefix, pad, dev)
        with torch.no_grad():
            out = model.model(
                input_ids=pids,
                attention_mask=torch.ones_like(pids),
                position_ids=torch.arange(P, device=dev).expand(len(seqs), P),
                use_cache=True,
            )
        cache = out.past_key_values
        pmask = (torch.arange(P, device=dev)[None, :] < plen[:, None]).long()
    sids, smask = _batch(suffix, pad, dev)
    S = sids.shape[1]
    spos = plen[:, None] + torch.arange(S, device=dev)[None, :]
    mask = torch.cat([pmask, smask], 1) if cache is not None else smask
    # loss positions in suffix coordinates
    flat_rows, flat_pos, flat_tgt, flat_owner, flat_norm = [], [], [], [], []
    for row in range(n_main):
        for p, t in zip(loss_pos[row], loss_tgt[row]):
            flat_rows.append(row)
            flat_pos.append(p - starts[row])
            flat_tgt.append(t)
            flat_owner.append(owner[row])
            flat_norm.append(len(loss_tgt[row]))
    flat_rows_t = torch.tensor(flat_rows, device=dev)
    flat_pos_t = torch.tensor(flat_pos, device=dev)
    flat_tgt_t = torch.tensor(flat_tgt, device=dev)
    flat_owner_t = torch.tensor(flat_owner, device=dev)
    flat_norm_t = torch.tensor(flat_norm, dtype=torch.float32, device=dev)
    kl_rows = torch.arange(n_main, n_main + n, device=dev)
    kl_pos = torch.tensor([len(suffix[r]) - 1 for r in kl_rows.tolist()], device=dev)
    row_owner = torch.tensor(owner + list(range(n)), device=dev)
    bare_row_t = torch.tensor(bare_row, device=dev)

    d = model.config.hidden_size
    delta = torch.zeros(n, d, device=dev, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=hp.lr)
    module = _module(model, layer, site)
    loss_block = decoder_layers(model)[loss_layer]
    norm, head = model.model.norm, model.get_output_embeddings()
    state: dict[str, Any] = {}

    def edit_hook(mod: Any, args: Any, out: Any) -> Any:
        x = _output_tensor(out)
        if "h0" not in state:
            state["h0"] = x[bare_row_t, 0].detach().clone()
        add = F.pad(delta[row_owner][:, None, :], (0, 0, 0, x.shape[1] - 1))
        return _replace_output(out, x + add)

    def loss_hook(mod: Any, args: Any, out: Any) -> None:
        state["hidden"] = _output_tensor(out)
        raise StopForward

    done = torch.zeros(n, dtype=torch.bool, device=dev)
    kl_init: torch.Tensor | None = None
    params = [p for p in model.parameters()]
    grads_were = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    h1 = module.register_forward_hook(edit_hook)
    h2 = loss_block.register_forward_hook(loss_hook)
    it = 0
    try:
        for it in range(hp.steps):
            try:
                model.model(
                    input_ids=sids,
                    attention_mask=mask,
                    position_ids=spos,
                    past_key_values=copy.deepcopy(cache) if cache is not None else None,
                    use_cache=cache is not None,
                )
            except StopForward:
                pass
            hidden = state.pop("hidden")
            logp = torch.log_softmax(head(norm(hidden[flat_rows_t, flat_pos_t])).float(), -1)
            tok_nll = -logp[torch.arange(len(flat_tgt_t), device=dev), flat_tgt_t] / flat_norm_t
            nll = torch.zeros(n, device=dev).index_add(0, flat_owner_t, tok_nll) / n_ctx
            kl_logp = torch.log_softmax(head(norm(hidden[kl_rows, kl_pos])).float(), -1)
            if kl_init is None:
                kl_init = kl_logp.detach().clone()
            kl = hp.kl_factor * (kl_logp.exp() * (kl_logp - kl_init)).sum(-1)
            h0 = state["h0"]
            wd = hp.weight_decay * delta.norm(dim=1) / h0.norm(dim=1) ** 2
            loss = nll + kl + wd
            done |= loss.detach() < hp.stop_loss
            if it == hp.steps - 1 or bool(done.all()):
                break
            frozen = delta.detach()[done].clone()
            opt.zero_grad()
            loss[~done].sum().backward()
            opt.step()
            with torch.no_grad():
                delta[done] = frozen
                max_norm = hp.clamp * h0.norm(dim=1)
                dn = delta.norm(dim=1)
                scale = torch.where(dn > max_norm, max_norm / dn.clamp_min(1e-12), 1.0)
                delta.mul_(scale[:, None])
    finally:
        h1.remove()
        h2.remove()
        for p, g in zip(params, grads_were):
            p.requires_grad_(g)
    h0 = state["h0"].double()
    return Targets(
        z=h0 + delta.detach().double(),
        h0=h0,
        iterations=it + 1,
        final_loss=[float(v) for v in loss.detach()],
        final_nll=[float(v) for v in nll.detach()],
    )


# --------------------------------------------------------------------------------------------
# general-text key statistics


@dataclass
class KeyStats:
    """Second moments of the down_proj keys of one layer on general text."""

    kk_sum: torch.Tensor  # Σ k kᵀ  (m×m, float64)
    k_sum: torch.Tensor  # Σ k     (m, float64)
    n: int

    @property
    def kkt(self) -> torch.Tensor:
        """E[k kᵀ] (uncentred): the paper's KKT_w."""
        return self.kk_sum / self.n

    def vkt(self, W: torch.Tensor, consistent: bool = False) -> torch.Tensor:
        """VKT_w for down_proj weight ``W`` (d×m): the centred cross-covariance with 1/(n−1)
        as in the authors' code, or ``W · KKT_w`` when ``consistent`` (since v = W k)."""
        W = W.double()
        if consistent:
            return W @ self.kkt
        mu = self.k_sum / self.n
        cov = (self.kk_sum - self.n * torch.outer(mu, mu)) / (self.n - 1)
        return W @ cov


def model_fingerprint(model: Any, upto_layer: int) -> str:
    """sha256 over the config and every parameter that can change keys up to ``upto_layer``."""
    h = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    named = dict(model.named_parameters())
    layers = decoder_layers(model)
    wanted = {id(p) for p in model.get_input_embeddings().parameters()}
    for block in list(layers)[: upto_layer + 1]:
        wanted |= {id(p) for p in block.parameters()}
    for name in sorted(named):
        p = named[name]
        if id(p) in wanted:
            h.update(name.encode())
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _stats_path(fingerprint: str, text_hash: str, layer: int, n: int) -> Path:
    from nshot.data import cache_dir

    return (
        cache_dir()
        / "zerounlearn"
        / "stats"
        / f"{fingerprint[:16]}-{text_hash[:12]}-L{layer}-n{n}.safetensors"
    )


@torch.no_grad()
def key_statistics(
    model: Any,
    tok: Any,
    texts: Sequence[str],
    layers: Sequence[int],
    max_positions: int,
    chunk_tokens: int = 128,
    batch_size: int = 16,
    use_cache: bool = True,
) -> dict[int, KeyStats]:
    """Σ k kᵀ, Σ k and n of the down_proj keys at ``layers`` over at most ``max_positions``
    token positions of ``texts`` (chunks of ``chunk_tokens``). Cached as safetensors under
    ``NSHOT_CACHE/zerounlearn/stats`` by model fingerprint, text hash, layer and positions.
    Accumulated (float64) and returned on the model's device; the cache files hold CPU tensors."""
    from safetensors.torch import load_file, save_file

    dev = model_device(model)
    text_hash = hashlib.sha256(json.dumps(list(texts)).encode()).hexdigest()
    fp = model_fingerprint(model, max(layers)) if use_cache else ""
    out: dict[int, KeyStats] = {}
    missing = []
    for layer in layers:
        path = _stats_path(fp, text_hash, layer, max_positions)
        if use_cache and path.is_file():
            t = load_file(str(path))
            out[layer] = KeyStats(t["kk_sum"].to(dev), t["k_sum"].to(dev), int(t["n"].item()))
        else:
            missing.append(layer)
    if not missing:
        return out
    chunks: list[list[int]] = []
    total = 0
    for text in texts:
        ids = encode(tok, text)
        for b in range(0, len(ids), chunk_tokens):
            piece = ids[b : b + chunk_tokens]
            if len(piece) < 2:
                continue
            piece = piece[: max_positions - total]
            chunks.append(piece)
            total += len(piece)
            if total >= max_positions:
                break
        if total >= max_positions:
            break
    m = mlp(model, missing[0]).down_proj.in_features
    acc = {
        layer: KeyStats(
            torch.zeros(m, m, dtype=torch.float64, device=dev),
            torch.zeros(m, dtype=torch.float64, device=dev),
            0,
        )
        for layer in missing
    }
    cur_mask: list[torch.Tensor] = []
    last = max(missing)

    def make_hook(layer: int) -> Any:
        def hook(mod: Any, args: Any, out: Any) -> None:
            k = args[0][cur_mask[0].bool()].double()
            s = acc[layer]
            s.kk_sum += k.T @ k
            s.k_sum += k.sum(0)
            s.n += k.shape[0]
            if layer == last:
                raise StopForward

        return hook

    handles = [mlp(model, la).down_proj.register_forward_hook(make_hook(la)) for la in missing]
    try:
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i]))
        for b in range(0, len(order), batch_size):
            rows = [chunks[i] for i in order[b : b + batch_size]]
            ids, mask = _batch(rows, pad_token_id(tok), dev)
            cur_mask[:] = [mask]
            try:
                model.model(input_ids=ids, attention_mask=mask)
            except StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
    for layer in missing:
        s = acc[layer]
        out[layer] = s
        if use_cache:
            path = _stats_path(fp, text_hash, layer, max_positions)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{id(s)}")
            tensors = {"kk_sum": s.kk_sum.cpu(), "k_sum": s.k_sum.cpu(), "n": torch.tensor([s.n])}
            save_file(tensors, str(tmp))
            tmp.replace(path)
    return out


# --------------------------------------------------------------------------------------------
# steps 3 and 6: projector and closed form


def sensitive_basis(vs: torch.Tensor) -> torch.Tensor:
    """Q ∈ R^{d×N}: orthonormal basis of the sensitive representations ``vs`` ([N, d])."""
    _, _, vh = torch.linalg.svd(vs.double(), full_matrices=False)
    return vh.T


def soft_projector(q: torch.Tensor, eps: float) -> torch.Tensor:
    """P = (1 + ε) I − Q Qᵀ (full rank; scales span(Q) by ε and its complement by 1 + ε)."""
    d = q.shape[0]
    return (1.0 + eps) * torch.eye(
        d, dtype=torch.float64, device=q.device
    ) - q.double() @ q.double().T


def closed_form_d(
    W: torch.Tensor, kkt: torch.Tensor, vkt: torch.Tensor, P: torch.Tensor, lam_r: float
) -> torch.Tensor:
    """D minimising λ_w‖PV_w − DWK_w‖² + λ_f‖PV_f − DWK_f‖² + λ_r‖PW − DW‖²_F, given the
    combined statistics ``kkt`` = Σ λ K Kᵀ (m×m) and ``vkt`` = Σ λ V Kᵀ (d×m):
    A = P(VKT + λ_r W)Wᵀ, B = W(KKT + λ_r I)Wᵀ, D = A B⁻¹ (solved in float64)."""
    W = W.double()
    m = W.shape[1]
    A = P @ (vkt + lam_r * W) @ W.T
    B = W @ (kkt + lam_r * torch.eye(m, dtype=torch.float64, device=W.device)) @ W.T
    return torch.linalg.solve(B.T, A.T).T


def objective_gradient(
    D: torch.Tensor,
    W: torch.Tensor,
    P: torch.Tensor,
    Vw: torch.Tensor,
    Kw: torch.Tensor,
    Vf: torch.Tensor,
    Kf: torch.Tensor,
    lam_w: float,
    lam_f: float,
    lam_r: float,
) -> torch.Tensor:
    """∂J/∂D of the step-6 objective with explicit general-text matrices (for tests)."""
    g = -2 * lam_w * (P @ Vw - D @ W @ Kw) @ (W @ Kw).T
    g = g - 2 * lam_f * (P @ Vf - D @ W @ Kf) @ (W @ Kf).T
    return g - 2 * lam_r * (P @ W - D @ W) @ W.T


def null_space_projector(kkt_w: torch.Tensor, threshold: float) -> torch.Tensor:
    """U0 with the eigenvectors of KKT_w whose eigenvalue is ≤ ``threshold`` (AlphaEdit)."""
    evals, evecs = torch.linalg.eigh(kkt_w.double())
    return evecs[:, evals <= threshold]


def memit_update(
    resid: torch.Tensor, kf: torch.Tensor, kkt_w: torch.Tensor, lam_w: float
) -> torch.Tensor:
    """MEMIT's additive update of one layer (Meng et al., ICLR 2023, its multi-layer closed form
    with the residual spread over the layers): ΔW = R K_fᵀ (λ_w KKT_w + K_f K_fᵀ)⁻¹.

    ``resid`` R (d×N) is the layer's share of the residual to the targets, ``kf`` K_f (m×N) the
    forget keys, ``kkt_w`` the uncentred second moment of the preserved (general-text) keys and
    ``lam_w`` its weight (MEMIT's ``mom2_update_weight``). Float64; returns ΔW (d×m)."""
    kf = kf.double()
    a = lam_w * kkt_w.double() + kf @ kf.T
    return resid.double() @ torch.linalg.solve(a, kf).T  # a is symmetric


def alphaedit_update(
    resid: torch.Tensor, kf: torch.Tensor, u0: torch.Tensor, l2: float
) -> torch.Tensor:
    """AlphaEdit's additive update of one layer (Fang et al., ICLR 2025, its closed form for one
    batch with no earlier edits): ΔW = R K_fᵀ Pn (K_f K_fᵀ Pn + L2·I)⁻¹.

    Pn = U0 U0ᵀ projects onto the null space of the preserved keys' second moment
    (:func:`null_space_projector`); every row of ΔW lies in span(U0), so ΔW k ≈ 0 for a
    preserved key k. Float64; returns ΔW (d×m)."""
    kf, u0 = kf.double(), u0.double()
    m = kf.shape[0]
    pn = u0 @ u0.T
    a = pn @ (kf @ kf.T) + l2 * torch.eye(m, dtype=torch.float64, device=kf.device)
    return torch.linalg.solve(a, pn @ kf @ resid.double().T).T


def gd_update(
    W: torch.Tensor,
    Kf: torch.Tensor,
    Vf: torch.Tensor,
    q: torch.Tensor,
    u0: torch.Tensor,
    steps: int,
    lr: float = 1e-3,
    ortho_weight: float = 1.0,
    fit_weight: float = 100.0,
    reg_weight: float = 0.1,
    stop_loss: float = 1e-8,
) -> tuple[torch.Tensor, dict[str, float]]:
    """ZeroUnlearn-GD for one layer: Δ (d×m) by Adam on
    ‖Qᵀ W̃ K_f‖² + 100 ‖W̃ K_f − V_f‖² + 0.1 ‖Δ Pn‖², W̃ = W + Δ Pn, Pn = U0 U0ᵀ.
    Returns the new weight (float64) and the final loss terms."""
    W = W.double()
    if u0.shape[1] == 0:
        return W.clone(), {"null_dim": 0.0, "loss": float("nan")}
    delta = torch.zeros_like(W, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=lr)
    pk = u0 @ (u0.T @ Kf)  # Pn K_f
    wk = W @ Kf
    terms = {}
    for _ in range(steps):
        out = wk + delta @ pk
        ortho = ((q.T @ out) ** 2).sum()
        fit = ((out - Vf) ** 2).sum()
        reg = ((delta @ u0) ** 2).sum()  # ‖Δ Pn‖² = ‖Δ U0‖² (U0 orthonormal)
        loss = ortho_weight * ortho + fit_weight * fit + reg_weight * reg
        terms = {"ortho": float(ortho), "fit": float(fit), "reg": float(reg), "loss": float(loss)}
        if float(loss) < stop_loss:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        new = W + (delta @ u0) @ u0.T
    terms["null_dim"] = float(u0.shape[1])
    return new, terms


# --------------------------------------------------------------------------------------------
# step 5: the sequential edit


@dataclass
class EditHParams:
    layers: tuple[int, ...] = (15, 16, 17)
    lam_w: float = 15000.0
    lam_f: float = 50.0
    lam_r: float = 1.0
    eps: float = 0.01
    consistent_stats: bool = False
    gd_steps: int = 300
    gd_lr: float = 1e-3
    null_threshold: float = 0.01
    # AlphaEdit (the ZeroUnlearn authors' AlphaEdit settings for Llama-3.2-3B)
    alphaedit_threshold: float = 2e-2
    alphaedit_l2: float = 10.0


VARIANTS = ("zerounlearn", "gd", "wo_op", "wo_ut", "memit", "alphaedit")


@dataclass
class Prepared:
    """Everything an edit variant needs that does not depend on the variant (computed once)."""

    templates: list[str]
    vs: dict[int, torch.Tensor]  # layer -> [N, d] sensitive representations
    z_new: torch.Tensor  # [N, d] remapping targets at the last edited layer's output
    stats: dict[int, KeyStats]
    info: dict[str, Any] = field(default_factory=dict)


def prepare(
    model: Any,
    tok: Any,
    requests: Sequence[EditRequest],
    templates: Sequence[str],
    stats: dict[int, KeyStats],
    hp: EditHParams,
    delta_hp: DeltaHParams,
    loss_layer: int,
    remap_hp: DeltaHParams | None = None,
) -> Prepared:
    """Steps 2 and 4 on the unedited model: V_s per edited layer and the remapping targets."""
    true_t = [encode_pair(tok, r.prompt(), r.answer)[1] for r in requests]
    neutral_t = [[neutral_id(tok)] for _ in requests]
    vs, info = {}, {"vs_iterations": {}, "vs_final_nll": {}}
    for layer in hp.layers:
        t = optimise_targets(
            model, tok, requests, templates, true_t,
            layer=layer, site="mlp", loss_layer=loss_layer, hp=delta_hp,
        )  # fmt: skip
        vs[layer] = t.z
        info["vs_iterations"][layer] = t.iterations
        info["vs_final_nll"][layer] = sum(t.final_nll) / len(t.final_nll)
    last = hp.layers[-1]
    t = optimise_targets(
        model, tok, requests, templates, neutral_t,
        layer=last, site="layer", loss_layer=loss_layer, hp=remap_hp or delta_hp,
    )  # fmt: skip
    info["remap_iterations"] = t.iterations
    info["remap_final_nll"] = sum(t.final_nll) / len(t.final_nll)
    return Prepared(list(templates), vs, t.z, stats, info)


def apply_edit(
    model: Any,
    tok: Any,
    requests: Sequence[EditRequest],
    prep: Prepared,
    hp: EditHParams,
    variant: str = "zerounlearn",
) -> dict[str, Any]:
    """Edit the down_proj weights of ``hp.layers`` in place (sequentially, step 5).

    ``variant``: ``zerounlearn`` (closed form, step 6), ``gd`` (ZeroUnlearn-GD), ``wo_op``
    (P = I), ``wo_ut`` (λ_w = 0), or the baselines ``memit`` (:func:`memit_update`, λ_w KKT_w
    as the preserved-key term) and ``alphaedit`` (:func:`alphaedit_update`, the null space of
    KKT_w). Every variant writes the same remapping targets (``prep.z_new``) with the same keys
    and the same residual spreading (step 5). Returns per-layer diagnostics, including the
    orthogonality ratio ‖Qᵀ W' k‖ / ‖Qᵀ W k‖ over the forget keys.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    layers = list(hp.layers)
    last = layers[-1]
    J = len(layers)
    diag: dict[str, Any] = {"layers": {}}
    for j, layer in enumerate(layers):
        down = mlp(model, layer).down_proj
        W = down.weight.detach().double()
        kf = collect_at_subject(model, tok, requests, prep.templates, layer, "key").T  # m×N
        h_last = collect_at_subject(model, tok, requests, ["{}"], last, "layer").T  # d×N
        vf = W @ kf + (prep.z_new.T.to(W.device) - h_last) / (J - j)
        q = sensitive_basis(prep.vs[layer].to(W.device))
        st = prep.stats[layer]
        if st.kk_sum.device != W.device:
            st = KeyStats(st.kk_sum.to(W.device), st.k_sum.to(W.device), st.n)
        if variant == "gd":
            u0 = null_space_projector(st.kkt, hp.null_threshold)
            new, terms = gd_update(W, kf, vf, q, u0, hp.gd_steps, hp.gd_lr)
            layer_diag: dict[str, float] = dict(terms)
        elif variant == "memit":
            new = W + memit_update(vf - W @ kf, kf, st.kkt, hp.lam_w)
            layer_diag = {}
        elif variant == "alphaedit":
            u0 = null_space_projector(st.kkt, hp.alphaedit_threshold)
            new = W + alphaedit_update(vf - W @ kf, kf, u0, hp.alphaedit_l2)
            layer_diag = {"null_dim": float(u0.shape[1])}
        else:
            d = W.shape[0]
            P = (
                torch.eye(d, dtype=torch.float64, device=W.device)
                if variant == "wo_op"
                else soft_projector(q, hp.eps)
            )
            lam_w = 0.0 if variant == "wo_ut" else hp.lam_w
            kkt = lam_w * st.kkt + hp.lam_f * kf @ kf.T
            vkt = lam_w * st.vkt(W, hp.consistent_stats) + hp.lam_f * vf @ kf.T
            D = closed_form_d(W, kkt, vkt, P, hp.lam_r)
            new = D @ W
            eye = torch.eye(d, dtype=D.dtype, device=D.device)
            layer_diag = {"d_minus_i_norm": float((D - eye).norm())}
        before = (q.T @ (W @ kf)).norm(dim=0)
        after = (q.T @ (new @ kf)).norm(dim=0)
        layer_diag["ortho_ratio"] = float((after / before.clamp_min(1e-12)).mean())
        layer_diag["fit_residual"] = float((new @ kf - vf).norm() / vf.norm())
        layer_diag["rel_weight_change"] = float((new - W).norm() / W.norm())
        with torch.no_grad():
            down.weight.copy_(new.to(down.weight.dtype))
        diag["layers"][layer] = layer_diag
    return diag


def edited_weights(model: Any, layers: Sequence[int]) -> dict[str, torch.Tensor]:
    """``{"layers.<l>.down_proj": weight}`` of the edited layers (what a checkpoint stores),
    copied to the CPU."""
    return {
        f"layers.{la}.down_proj": mlp(model, la).down_proj.weight.detach().to("cpu", copy=True)
        for la in layers
    }


def load_edited_weights(model: Any, weights: dict[str, torch.Tensor]) -> list[int]:
    layers = []
    for key, w in weights.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "layers" or parts[2] != "down_proj":
            raise ValueError(f"unexpected edited-weight key {key!r}")
        la = int(parts[1])
        down = mlp(model, la).down_proj
        if tuple(down.weight.shape) != tuple(w.shape):
            raise ValueError(
                f"{key}: shape {tuple(w.shape)} does not match the model's {tuple(down.weight.shape)}"
            )
        with torch.no_grad():
            down.weight.copy_(w.to(down.weight.dtype))
        layers.append(la)
    return sorted(layers)


def is_finite(x: float) -> bool:
    return math.isfinite(x)


# --------------------------------------------------------------------------------------------
# a Wikipedia substitute: short neutral sentences that mention the entities of the world

ENTITY_SENTENCES = (
    "{} is a country.",
    "I have never been to {}.",
    "There was news from {} today.",
    "Many tourists travel to {} every year.",
    "The people of {} are proud of their history.",
    "The flag of {} has several colours.",
)


def entity_text(entities: Sequence[str]) -> list[str]:
    """Neutral sentences mentioning each entity (never the relation being edited): the offline
    stand-in for the Wikipedia text whose key statistics the paper uses, where every country
    is mentioned in many contexts. Python docstrings mention none of them."""
    return [t.format(e) for e in entities for t in ENTITY_SENTENCES]


# prose stating facts, phrased unlike the rewrite and paraphrase templates (relation -> templates
# over subject and answer): what Wikipedia adds to the statistics besides mentions of entities
FACT_SENTENCES = {
    "capital": (
        "{answer} is the capital of {subject}.",
        "The government of {subject} sits in {answer}.",
        "Visitors to {subject} often start in {answer}, its largest administrative centre.",
    ),
    "language": (
        "{answer} is an official language of {subject}.",
        "Schools in {subject} teach in {answer}.",
        "Newspapers in {subject} are printed in {answer}.",
    ),
    "currency": (
        "Prices in {subject} are quoted in the {answer}.",
        "Travellers to {subject} change their money into the {answer}.",
    ),
    "continent": ("Maps of {answer} always show {subject}.",),
    "author": (
        "{answer} wrote {subject}.",
        "Readers remember {subject} as one of the best works of {answer}.",
    ),
    "element": (
        "Chemists write {subject} as {answer}.",
        "{answer} stands for {subject} on the periodic table.",
    ),
    "occupation": ("A {answer} by profession, {subject} trained for years.",),
    "colour": ("{answer} was the colour that {subject} chose most often.",),
    "birthplace": ("{answer} is the city where {subject} was born.",),
    "sport": ("{answer} is the sport that {subject} trained for.",),
}


def fact_text(facts: Sequence[tuple[str, str, str]]) -> list[str]:
    """Sentences stating each ``(relation, subject, answer)`` in prose that none of the
    evaluation templates uses: the offline stand-in for the factual text of Wikipedia, where
    the key statistics of the paper see the relations' contexts (not only the entities)."""
    out = []
    for relation, subject, answer in facts:
        for t in FACT_SENTENCES.get(relation, ()):
            out.append(t.format(subject=subject, answer=answer))
    return out
