"""TG-DT's model (paper §3): a character-level text encoder (or, ``text_encoder='minilm'``,
frozen MiniLM sentence embeddings: the backbone ``minilm`` of :mod:`nshot.nn.backbone`), a
decision transformer over (return-to-go, state, action) tokens that cross-attends to the
description's tokens, and the two alignment heads: TBC (contrastive: projected, normalised text
and trajectory embeddings with a learnable temperature) and TBM (matching: a 2-way head on the
text-conditioned trajectory).

The baselines share the decoder: ``naive_text_dt`` concatenates the pooled text embedding to
every token, ``oracle_dt`` the true goal, ``agnostic_dt`` nothing, and ``prompt_dt`` prepends
the tokens of an expert segment of the task (Prompt-DT).

Masks: the action at step t is read from the output at the token of s_t under a causal mask,
so it never depends on a_t or anything after it; padded positions (left padding of the first
steps of an episode) are masked out as keys and never enter a loss. The alignment passes (TBC,
TBM) run bidirectionally and mean-pool the trajectory's real tokens (a causal decoder's first
token sees only R̂_1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import NshotError
from nshot.train.checkpoint import LoadedCheckpoint

from .config import TGDTConfig
from .data import MAX_DESC_LEN, VOCAB, tokenize


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q, self.kv, self.out = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def forward(
        self,
        x: torch.Tensor,
        mem: torch.Tensor,
        allowed: torch.Tensor,
        index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``allowed``: bool (B, Lq, Lk), True where a query may attend to a key. ``index``:
        row ``i`` of ``x`` attends to row ``index[i]`` of ``mem`` (keys and values are
        projected once per memory row)."""
        b, lq, d = x.shape
        q = self.q(x).view(b, lq, self.heads, -1).transpose(1, 2)
        kv = self.kv(mem)
        if index is not None:
            kv = kv[index]
        k, v = kv.view(b, kv.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed[:, None], dropout_p=self.dropout if self.training else 0.0
        )
        return self.out(y.transpose(1, 2).reshape(b, lq, d))


class Block(nn.Module):
    """Pre-norm transformer block: self-attention, optional cross-attention, MLP."""

    def __init__(self, d: int, heads: int, dropout: float, cross: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, dropout)
        self.cross = Attention(d, heads, dropout) if cross else None
        self.ln_c = nn.LayerNorm(d) if cross else None
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, allowed, mem=None, mem_allowed=None, index=None):  # noqa: ANN001
        h = self.ln1(x)
        x = x + self.drop(self.attn(h, h, allowed))
        if mem is not None and self.cross is not None:
            x = x + self.drop(self.cross(self.ln_c(x), mem, mem_allowed, index))
        return x + self.drop(self.mlp(self.ln2(x)))


def self_mask(valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, L, L) bool: a query attends to real keys (not after it, when causal) and always to
    itself (so a padded query has one key and no NaN)."""
    length = valid.shape[1]
    eye = torch.eye(length, dtype=torch.bool, device=valid.device)
    allowed = valid[:, None, :].expand(-1, length, -1)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool,
                                       device=valid.device).tril()  # fmt: skip
    return allowed | eye


def pool(h: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    w = valid.to(h.dtype)[..., None]
    return (h * w).sum(1) / w.sum(1).clamp_min(1.0)


class TextEncoder(nn.Module):
    """Character-level bidirectional transformer (paper §3's text encoder, scaled down)."""

    def __init__(self, cfg: TGDTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.emb = nn.Embedding(VOCAB, d, padding_idx=0)
        self.pos = nn.Embedding(MAX_DESC_LEN, d)
        self.blocks = nn.ModuleList(
            Block(d, cfg.heads, cfg.dropout, cross=False) for _ in range(cfg.text_layers)
        )
        self.ln = nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        valid = ids != 0
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        allowed = self_mask(valid, causal=False)
        for block in self.blocks:
            x = block(x, allowed)
        return self.ln(x), valid


class MiniLMEncoder(nn.Module):
    """Frozen all-MiniLM-L6-v2 sentence embeddings (the pretrained text encoder of paper §3, in
    place of BLIP's; the backbone ``minilm`` of :mod:`nshot.nn.backbone`, memoised per text,
    the most recently used kept) and a trained projection: one memory token per description.
    The encoder is not a submodule (only the projection is in the state dict)."""

    def __init__(self, cfg: TGDTConfig) -> None:
        super().__init__()
        from nshot.nn.backbone import BackboneSpec, load_backbone

        self.encoder = load_backbone(BackboneSpec("minilm"))
        d = cfg.d_model
        self.proj = nn.Sequential(nn.Linear(self.encoder.dim, d), nn.GELU(), nn.Linear(d, d))

    def forward(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.proj[0].weight.device
        emb = self.encoder.embed(texts).to(dev)
        return self.proj(emb)[:, None], torch.ones(len(texts), 1, dtype=torch.bool, device=dev)


@dataclass
class Text:
    """Encoded unique descriptions and, per sequence, which one it reads."""

    tokens: torch.Tensor  # (U, Lt, d)
    valid: torch.Tensor  # (U, Lt)
    index: torch.Tensor  # (B,)


@dataclass
class Window:
    """A batch of K-step windows (left-padded): R̂ already divided by the scale."""

    rtg: torch.Tensor  # (B, K)
    states: torch.Tensor  # (B, K, state_dim)
    actions: torch.Tensor  # (B, K, act_dim)
    timesteps: torch.Tensor  # (B, K) long
    valid: torch.Tensor  # (B, K) bool


class TGDTModel(nn.Module):
    def __init__(self, cfg: TGDTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.system = cfg.system
        self.cross = cfg.cross
        self.embed_rtg = nn.Linear(1, d)
        self.max_action = cfg.max_action
        self.embed_state = nn.Linear(cfg.state_dim, d)
        self.embed_action = nn.Linear(cfg.act_dim, d)
        self.embed_time = nn.Embedding(cfg.horizon, d)
        self.ln_in = nn.LayerNorm(d)
        self.blocks = nn.ModuleList(
            Block(d, cfg.heads, cfg.dropout, cross=cfg.cross) for _ in range(cfg.layers)
        )
        self.ln_out = nn.LayerNorm(d)
        self.action_head = nn.Linear(d, cfg.act_dim)
        self.text: TextEncoder | MiniLMEncoder | None = None
        if cfg.uses_text:
            self.text = TextEncoder(cfg) if cfg.text_encoder == "char" else MiniLMEncoder(cfg)
        if cfg.system == "naive_text_dt":
            self.cond = nn.Linear(2 * d, d)
        elif cfg.system == "oracle_dt":
            self.cond = nn.Linear(d + cfg.goal_dim, d)
        if cfg.system == "prompt_dt":
            self.prompt_marker = nn.Parameter(torch.zeros(d))
        if cfg.tbc:
            self.text_proj = nn.Linear(d, d, bias=False)
            self.traj_proj = nn.Linear(d, d, bias=False)
            self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        if cfg.tbm:
            self.tbm_head = nn.Linear(d, 2)
        self.register_buffer("state_mean", torch.zeros(cfg.state_dim))
        self.register_buffer("state_std", torch.ones(cfg.state_dim))
        self.register_buffer("target_return", torch.zeros(()))
        if cfg.balanced:  # (w_tbc, w_tbm) factors measured at initialisation (train.py)
            self.register_buffer("align_factors", torch.full((2,), float("nan")))

    @property
    def has_tbc(self) -> bool:
        return hasattr(self, "text_proj")

    @property
    def has_tbm(self) -> bool:
        return hasattr(self, "tbm_head")

    # ------------------------------------------------------------------ pieces
    def encode_text(self, texts: list[str], index: torch.Tensor) -> Text:
        """The unique descriptions ``texts`` encoded; sequence i reads ``texts[index[i]]``."""
        assert self.text is not None
        if isinstance(self.text, MiniLMEncoder):
            tokens, valid = self.text(texts)
        else:
            tokens, valid = self.text(
                torch.as_tensor(tokenize(texts), device=self.state_mean.device)
            )
        return Text(tokens, valid, index)

    def tokens(self, w: Window) -> tuple[torch.Tensor, torch.Tensor]:
        """Interleaved (R̂_1, s_1, a_1, R̂_2, …) embeddings (B, 3K, d) and their validity."""
        b, k = w.rtg.shape
        t = self.embed_time(w.timesteps)
        s = (w.states - self.state_mean) / self.state_std
        e = torch.stack([self.embed_rtg(w.rtg[..., None]) + t, self.embed_state(s) + t,
                         self.embed_action(w.actions / self.max_action) + t], 2)  # fmt: skip
        return e.reshape(b, 3 * k, -1), w.valid.repeat_interleave(3, 1)

    def decode(self, x, valid, causal, text: Text | None = None):  # noqa: ANN001
        allowed = self_mask(valid, causal)
        mem = mem_allowed = index = None
        if text is not None and self.cross:
            mem, index = text.tokens, text.index
            mem_allowed = text.valid[index][:, None, :].expand(-1, x.shape[1], -1)
        for block in self.blocks:
            x = block(x, allowed, mem, mem_allowed, index)
        return self.ln_out(x)

    def condition(self, x, text: Text | None, goal: torch.Tensor | None):  # noqa: ANN001
        if self.system == "naive_text_dt":
            assert text is not None
            pooled = pool(text.tokens, text.valid)[text.index]
            x = self.cond(torch.cat([x, pooled[:, None].expand(-1, x.shape[1], -1)], -1))
        elif self.system == "oracle_dt":
            if goal is None:
                raise ValueError("goal: the oracle DT needs the goal")
            x = self.cond(torch.cat([x, goal[:, None].to(x.dtype).expand(-1, x.shape[1], -1)],
                                    -1))  # fmt: skip
        return x

    # ------------------------------------------------------------------ heads
    def act(
        self,
        w: Window,
        text: Text | None = None,
        goal: torch.Tensor | None = None,
        prompt: Window | None = None,
    ) -> torch.Tensor:
        """Predicted actions (B, K, act_dim) in units of the action bound (tanh, in [−1, 1]): the one of
        step t is read at the token of s_t."""
        x, valid = self.tokens(w)
        x = self.condition(x, text, goal)
        n_prompt = 0
        if self.system == "prompt_dt":
            if prompt is None:
                raise ValueError("prompt: the Prompt-DT needs a prompt segment")
            px, pvalid = self.tokens(prompt)
            n_prompt = px.shape[1]
            x, valid = torch.cat([px + self.prompt_marker, x], 1), torch.cat([pvalid, valid], 1)
        h = self.decode(self.ln_in(x), valid, causal=True, text=text)[:, n_prompt:]
        return torch.tanh(self.action_head(h[:, 1::3]))

    def traj_embedding(self, w: Window) -> torch.Tensor:
        """TBC's trajectory side: unimodal bidirectional pass, mean-pooled, projected, unit."""
        x, valid = self.tokens(w)
        h = self.decode(self.ln_in(x), valid, causal=False)
        return F.normalize(self.traj_proj(pool(h, valid)), dim=-1)

    def text_embedding(self, text: Text) -> torch.Tensor:
        """TBC's text side (one row per unique description)."""
        return F.normalize(self.text_proj(pool(text.tokens, text.valid)), dim=-1)

    def tbm_logits(self, w: Window, text: Text) -> torch.Tensor:
        """TBM: (B, 2) match logits of the text-conditioned, bidirectional pass."""
        x, valid = self.tokens(w)
        h = self.decode(self.ln_in(x), valid, causal=False, text=text)
        return self.tbm_head(pool(h, valid))


def load_model(checkpoint: LoadedCheckpoint) -> tuple[TGDTModel, TGDTConfig]:
    """The model of a tgdt checkpoint (eval mode) and its config."""
    cfg = TGDTConfig.validated(checkpoint.config)
    model = TGDTModel(cfg)
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the config: {err}") from None
    return model.eval(), cfg
