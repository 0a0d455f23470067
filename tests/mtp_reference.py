"""A numpy reference of the Qwen3-Next / Qwen3.5 MTP module, written from the checkpoint's config and its raw HF
tensors (`mtp.*`, nothing of Ember's spec, loader or plan): what the MTP tests compare Ember against.

    e = norm(embed(token)); h = norm(hidden)                 zero-centred RMSNorms x̂ * (1 + w)
    x = fc([e, h])                                           embedding half first
    x = x + o_proj(attention(...) * sigmoid(gate))            gated attention: q_proj holds [query, gate] per head,
                                                             q/k norms per head, RoPE on the first
                                                             partial_rotary_factor of each head (neox halves)
    x = x + mlp(post_attention_norm(x))                      dense SwiGLU, or top-k MoE + sigmoid-gated shared expert
    logits = lm_head(norm(x))                                lm_head tied to the embedding when the config says so

Inputs are causal over one sequence: row p holds (hidden at p, token at p + 1) at position p.
"""

from __future__ import annotations

import numpy as np

from ember.runtime.loading.checkpoint import open_checkpoint


def _norm(x, w, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _rope(x, positions, rot, theta):
    # x [T, H, dh]; only x[..., :rot] rotates, as two halves (neox)
    inv = 1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    angles = positions[:, None].astype(np.float64) * inv[None]  # [T, rot / 2]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    a, b, rest = x[..., : rot // 2], x[..., rot // 2 : rot], x[..., rot:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=-1)


class MtpReference:
    def __init__(self, folder):
        ckpt = open_checkpoint(folder)
        self.config = cfg = ckpt.config
        self.t = lambda name: np.asarray(ckpt.load(name), np.float64)  # float64: the reference, not a peer
        self.has = ckpt.has_tensor
        self.eps = cfg["rms_norm_eps"]
        self.hq, self.hkv, self.dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        rope = cfg.get("rope_parameters") or {}
        self.theta = rope.get("rope_theta", 10000.0)
        self.rot = int(self.dh * rope.get("partial_rotary_factor", 1.0))
        self.embed = self.t("model.embed_tokens.weight")
        self.head = self.embed if cfg.get("tie_word_embeddings") else self.t("lm_head.weight")

    def __call__(self, tokens, hidden):
        """tokens [T] (the token at p + 1 for each row p), hidden [T, d] -> (logits [T, vocab], hidden out [T, d])."""
        t, eps = self.t, self.eps
        e = _norm(self.embed[np.asarray(tokens)], t("mtp.pre_fc_norm_embedding.weight"), eps)
        h = _norm(np.asarray(hidden, np.float64), t("mtp.pre_fc_norm_hidden.weight"), eps)
        x = np.concatenate([e, h], axis=-1) @ t("mtp.fc.weight").T
        p = "mtp.layers.0."
        x = x + self._attention(_norm(x, t(p + "input_layernorm.weight"), eps), p + "self_attn.")
        x = x + self._mlp(_norm(x, t(p + "post_attention_layernorm.weight"), eps), p + "mlp.")
        out = _norm(x, t("mtp.norm.weight"), eps)
        return out @ self.head.T, out

    def _attention(self, x, p):
        t, n = self.t, x.shape[0]
        qg = (x @ t(p + "q_proj.weight").T).reshape(n, self.hq, 2 * self.dh)
        q, gate = qg[..., : self.dh], qg[..., self.dh :]
        k = (x @ t(p + "k_proj.weight").T).reshape(n, self.hkv, self.dh)
        v = (x @ t(p + "v_proj.weight").T).reshape(n, self.hkv, self.dh)
        q, k = _norm(q, t(p + "q_norm.weight"), self.eps), _norm(k, t(p + "k_norm.weight"), self.eps)
        positions = np.arange(n)
        q, k = _rope(q, positions, self.rot, self.theta), _rope(k, positions, self.rot, self.theta)
        group = self.hq // self.hkv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) * self.dh**-0.5
        scores = np.where(np.tril(np.ones((n, n), bool))[None], scores, -np.inf)
        a = np.einsum("hqk,khd->qhd", _softmax(scores), v)
        return (a * _sigmoid(gate)).reshape(n, -1) @ t(p + "o_proj.weight").T

    def _swiglu(self, x, p):
        t = self.t
        return (_silu(x @ t(p + "gate_proj.weight").T) * (x @ t(p + "up_proj.weight").T)) @ t(p + "down_proj.weight").T

    def _mlp(self, x, p):
        if not self.has(p + "gate.weight"):
            return self._swiglu(x, p)
        cfg = self.config
        probs = _softmax(x @ self.t(p + "gate.weight").T)  # [T, experts]
        chosen = np.argsort(-probs, axis=-1, kind="stable")[:, : cfg["num_experts_per_tok"]]
        weights = np.take_along_axis(probs, chosen, axis=-1)
        if cfg.get("norm_topk_prob", True):
            weights = weights / weights.sum(axis=-1, keepdims=True)
        experts = np.stack([self._swiglu(x, f"{p}experts.{e}.") for e in range(cfg["num_experts"])], axis=1)
        routed = np.einsum("tk,tkd->td", weights, np.take_along_axis(experts, chosen[..., None], axis=1))
        shared = self._swiglu(x, p + "shared_expert.") * _sigmoid(x @ self.t(p + "shared_expert_gate.weight").T)
        return routed + shared
