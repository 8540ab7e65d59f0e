"""A slow float64 numpy oracle of DS4 Flash, token by token, transcribed from model.md §3-4.

Written from the spec, not from ds4agent/engine/model.py: it follows the streaming definition
literally (one token at a time, the compressor state exactly as §4.4 describes it, including the
row copy of ratio-4 windows), uses code tables for the E4M3/E2M1 roundings and the popcount
definition of the Hadamard transform. It reads the weights by their GGUF tensor names
(`ds4agent.testmodels.random_weights.random_tensors`), dequantised, as float64.

`rounding=False` turns off the three rounding simulations (f16 rows, fp8sim, the fp4 step of
qat) exactly like the engine's test switch.
"""

from __future__ import annotations

import math

import numpy as np

# ---- rounding primitives (scalar-table definitions) ---------------------------------------------

E4M3_VALUES = np.array(
    [(c & 7) * 2.0**-9 if (c >> 3) == 0 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7) for c in range(127)]
)
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nearest_code(table: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Nearest table value of |v| (ties to the even code), sign kept."""
    a = np.abs(v)[..., None]
    dist = np.abs(a - table)
    best = dist.min(axis=-1, keepdims=True)
    cand = dist == best
    codes = np.arange(len(table))
    # among tied codes prefer an even one (ties only ever involve two neighbours)
    pref = np.where(cand, np.where(codes % 2 == 0, 0, 1) * 1000 + codes, 10**9)
    c = pref.argmin(axis=-1)
    return np.sign(v) * table[c]


def pow2_ceil_log2(y: float) -> float:
    m, e = math.frexp(y)  # y = m·2^e, 0.5 <= m < 1
    return 2.0 ** (e - 1 if m == 0.5 else e)


def fp8sim(x: np.ndarray, dn: int) -> np.ndarray:
    x = np.array(x, dtype=np.float64)
    for b0 in range(0, dn, 64):
        blk = x[b0:b0 + 64]
        amax = max(np.abs(blk).max(), 1e-4)
        s = pow2_ceil_log2(amax / 448.0)
        v = np.clip(blk / s, -448.0, 448.0)
        x[b0:b0 + 64] = nearest_code(E4M3_VALUES, v) * s
    return x


def fp4sim(x: np.ndarray) -> np.ndarray:
    x = np.array(x, dtype=np.float64)
    for b0 in range(0, len(x), 32):
        blk = x[b0:b0 + 32]
        amax = max(np.abs(blk).max(), 6.0 * 2.0**-126)
        s = pow2_ceil_log2(amax / 6.0)
        v = np.clip(blk / s, -6.0, 6.0)
        x[b0:b0 + 32] = nearest_code(E2M1_VALUES, v) * s
    return x


def f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def hadamard(x: np.ndarray) -> np.ndarray:
    d = len(x)
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(d)] for i in range(d)], dtype=np.float64)
    return (h @ x) / math.sqrt(d)


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    y = x * (1.0 / math.sqrt(float(np.mean(x * x)) + eps))
    return y if w is None else y * w


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def softplus(z: np.ndarray) -> np.ndarray:
    return np.where(z > 20, z, np.where(z < -20, np.exp(np.minimum(z, 20)), np.log1p(np.exp(np.clip(z, -20, 20)))))


def silu(z):
    return z * sigmoid(z)


# ---- the model -------------------------------------------------------------------------------------


class Reference:
    """Token-by-token float64 oracle. `step(t)` returns the logits after t and records decisions."""

    def __init__(self, config, tensors: dict[str, np.ndarray], *, rounding: bool = True):
        self.c = config
        self.rounding = rounding
        self.w = {k: (np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v))
                  for k, v in tensors.items()}
        c = config
        self.p = 0
        self.tokens: list[int] = []
        L = c.n_layers
        self.raw: list[list[np.ndarray]] = [[] for _ in range(L)]  # all raw rows (window = last W)
        self.comp: list[list[np.ndarray]] = [[] for _ in range(L)]
        self.icomp: list[list[np.ndarray]] = [[] for _ in range(L)]
        self.front: list[dict | None] = []
        self.ifront: list[dict | None] = []
        for li in range(L):
            r = c.ratios[li]
            if r == 0:
                self.front.append(None)
                self.ifront.append(None)
                continue
            coff = 2 if r == 4 else 1
            self.front.append(self._new_frontier(coff * r, coff * c.head_dim))
            self.ifront.append(self._new_frontier(8, 2 * c.indexer_dim) if r == 4 else None)
        self.allowed: list[dict[int, list[int]]] = [{} for _ in range(L)]  # layer -> p -> rows
        self.experts: list[dict[int, list[int]]] = [{} for _ in range(L)]
        self.logits: np.ndarray | None = None

    @staticmethod
    def _new_frontier(rows: int, cols: int) -> dict:
        return {"kv": np.zeros((rows, cols)), "sc": np.full((rows, cols), -1.0e30)}

    # -- rope
    def _theta(self, p: int, compressed: bool) -> np.ndarray:
        c = self.c
        half = c.rope_dim // 2
        k = np.arange(half, dtype=np.float64)
        if not compressed:
            return p * c.rope_base ** (-2.0 * k / c.rope_dim)
        b = c.compress_rope_base
        te = p * b ** (-2.0 * k / c.rope_dim)

        def corr(beta):
            return c.rope_dim * math.log(c.yarn_orig_ctx / (beta * 2 * math.pi)) / (2 * math.log(b))

        lo = max(0, math.floor(corr(c.yarn_beta_fast)))
        hi = min(c.rope_dim - 1, math.ceil(corr(c.yarn_beta_slow)))
        ramp = 1.0 - np.clip((k - lo) / max(0.001, hi - lo), 0.0, 1.0)
        return te * ramp + (te / c.yarn_factor) * (1.0 - ramp)

    def rope(self, v: np.ndarray, p: int, compressed: bool, inverse: bool = False) -> np.ndarray:
        v = np.array(v, dtype=np.float64)
        th = self._theta(p, compressed)
        if inverse:
            th = -th
        o = len(v) - self.c.rope_dim
        for k in range(self.c.rope_dim // 2):
            x0, x1 = v[o + 2 * k], v[o + 2 * k + 1]
            cs, sn = math.cos(th[k]), math.sin(th[k])
            v[o + 2 * k] = x0 * cs - x1 * sn
            v[o + 2 * k + 1] = x0 * sn + x1 * cs
        return v

    # -- HC
    def hc_pre(self, R: np.ndarray, prefix: str):
        c = self.c
        n = c.hc_count
        flat = rms_norm(R.reshape(-1), None, c.rms_eps)
        mix = self.w[f"{prefix}_fn.weight"] @ flat
        s = self.w[f"{prefix}_scale.weight"]
        b = self.w[f"{prefix}_base.weight"]
        eps = c.hc_eps
        pre = np.array([sigmoid(mix[i] * s[0] + b[i]) + eps for i in range(n)])
        post = np.array([2 * sigmoid(mix[n + i] * s[1] + b[n + i]) for i in range(n)])
        C = np.array([[mix[2 * n + n * d + cc] * s[2] + b[2 * n + n * d + cc] for cc in range(n)]
                      for d in range(n)])
        for d in range(n):
            e = np.exp(C[d] - C[d].max())
            C[d] = e / e.sum() + eps
        for cc in range(n):
            C[:, cc] /= C[:, cc].sum() + eps
        for _ in range(c.hc_sinkhorn_iters - 1):
            for d in range(n):
                C[d] /= C[d].sum() + eps
            for cc in range(n):
                C[:, cc] /= C[:, cc].sum() + eps
        x = sum(pre[h] * R[h] for h in range(n))
        return x, post, C

    @staticmethod
    def hc_post(R, y, post, C):
        n = R.shape[0]
        return np.stack([post[j] * y + sum(C[i][j] * R[i] for i in range(n)) for j in range(n)])

    # -- compressor (§4.4), returns the emitted row or None
    def compressor(self, st: dict, prefix: str, a: np.ndarray, p: int, r: int, d: int,
                   compressed_rope: bool, kind: str):
        w = self.w
        kvp = w[f"{prefix}_kv.weight"] @ a
        scp = w[f"{prefix}_gate.weight"] @ a + w[f"{prefix}_ape.weight"][p % r]
        rho = 4 + p % 4 if r == 4 else p % r
        st["kv"][rho] = kvp
        st["sc"][rho] = scp
        if (p + 1) % r != 0:
            return None
        k = (p + 1) // r - 1
        if r == 4:
            cand_s = np.concatenate([st["sc"][0:4, :d], st["sc"][4:8, d:]], axis=0)
            cand_v = np.concatenate([st["kv"][0:4, :d], st["kv"][4:8, d:]], axis=0)
        else:
            cand_s, cand_v = st["sc"], st["kv"]
        pooled = np.zeros(d)
        for j in range(d):
            M = cand_s[:, j].max()
            if M <= -5e29:
                pooled[j] = 0.0
            else:
                e = np.exp(cand_s[:, j] - M)
                pooled[j] = (e * cand_v[:, j]).sum() / e.sum()
        cvec = rms_norm(pooled, w[f"{prefix}_norm.weight"], self.c.rms_eps)
        cvec = self.rope(cvec, r * k, compressed_rope)
        if kind == "attn":
            if self.rounding:
                cvec = fp8sim(cvec, self.c.head_dim - self.c.rope_dim)
        else:
            cvec = hadamard(cvec)
            if self.rounding:
                cvec = fp4sim(cvec)
        if self.rounding:
            cvec = f16(cvec)
        if r == 4:
            st["kv"][0:4] = st["kv"][4:8]
            st["sc"][0:4] = st["sc"][4:8]
        return cvec

    def attention(self, li: int, x: np.ndarray, t: int, p: int) -> np.ndarray:
        c, w = self.c, self.w
        b = f"blk.{li}."
        r = c.ratios[li]
        cr = r != 0
        H, Dh, Dr = c.n_heads, c.head_dim, c.rope_dim
        eps = c.rms_eps
        a = rms_norm(x, w[f"{b}attn_norm.weight"], eps)
        qr = rms_norm(w[f"{b}attn_q_a.weight"] @ a, w[f"{b}attn_q_a_norm.weight"], eps)
        q = (w[f"{b}attn_q_b.weight"] @ qr).reshape(H, Dh)
        q = np.stack([rms_norm(q[h], None, eps) for h in range(H)])
        kv = rms_norm(w[f"{b}attn_kv.weight"] @ a, w[f"{b}attn_kv_a_norm.weight"], eps)
        q = np.stack([self.rope(q[h], p, cr) for h in range(H)])
        kv = self.rope(kv, p, cr)
        if self.rounding:
            kv = f16(fp8sim(kv, Dh - Dr))
        self.raw[li].append(kv)
        allowed_rows: list[int] = []
        if r != 0:
            row = self.compressor(self.front[li], f"{b}attn_compressor", a, p, r, Dh, cr, "attn")
            if row is not None:
                self.comp[li].append(row)
            allowed_rows = list(range(len(self.comp[li])))
        if r == 4:
            irow = self.compressor(self.ifront[li], f"{b}indexer_compressor", a, p, 4, c.indexer_dim,
                                   cr, "index")
            if irow is not None:
                self.icomp[li].append(irow)
            nrows = len(self.icomp[li])
            K = c.indexer_top_k
            if nrows > K:
                Hi, Di = c.indexer_heads, c.indexer_dim
                iq = (w[f"{b}indexer.attn_q_b.weight"] @ qr).reshape(Hi, Di)
                iq = [hadamard(self.rope(iq[h], p, cr)) for h in range(Hi)]
                if self.rounding:
                    iq = [fp4sim(v) for v in iq]
                wts = (w[f"{b}indexer.proj.weight"] @ a) * (1.0 / math.sqrt(Di * Hi))
                keys = np.stack(self.icomp[li])
                score = np.zeros(nrows)
                for h in range(Hi):
                    score += np.maximum(0.0, keys @ iq[h]) * wts[h]
                order = np.argsort(-score, kind="stable")  # ties -> lower row
                allowed_rows = sorted(int(i) for i in order[:K])
            self.allowed[li][p] = list(allowed_rows)
        window = self.raw[li][-c.window:]
        keys = window + [self.comp[li][i] for i in allowed_rows]
        Kmat = np.stack(keys)
        sinks = w[f"{b}attn_sinks.weight"]
        o = np.zeros((H, Dh))
        for h in range(H):
            s = Kmat @ q[h] / math.sqrt(Dh)
            m = max(sinks[h], s.max())
            e = np.exp(s - m)
            o[h] = (e @ Kmat) / (math.exp(sinks[h] - m) + e.sum())
            o[h] = self.rope(o[h], p, cr, inverse=True)
        G, O = c.out_groups, c.out_lora_rank
        hpg = H // G
        A = w[f"{b}attn_output_a.weight"]
        z = np.concatenate([A[O * g:O * g + O] @ o[hpg * g:hpg * (g + 1)].reshape(-1) for g in range(G)])
        return w[f"{b}attn_output_b.weight"] @ z

    def ffn(self, li: int, x: np.ndarray, t: int, p: int) -> np.ndarray:
        c, w = self.c, self.w
        b = f"blk.{li}."
        U = c.n_experts_used
        clamp = c.swiglu_clamp[li]
        h = rms_norm(x, w[f"{b}ffn_norm.weight"], c.rms_eps)
        prob = np.sqrt(softplus(w[f"{b}ffn_gate_inp.weight"] @ h))
        if li < c.n_hash_layers:
            sel = [int(e) for e in w[f"{b}ffn_gate_tid2eid.weight"][t][:U]]
        else:
            biased = prob + w[f"{b}exp_probs_b.bias"] if f"{b}exp_probs_b.bias" in w else prob
            sel = [int(e) for e in np.argsort(-biased, kind="stable")[:U]]
        self.experts[li][p] = sel
        ps = np.array([prob[e] for e in sel])
        wk = ps / max(ps.sum(), 6.103515625e-5) * c.expert_weights_scale
        routed = np.zeros(c.dim)
        for k, e in enumerate(sel):
            g = np.minimum(w[f"{b}ffn_gate_exps.weight"][e] @ h, clamp)
            u = np.clip(w[f"{b}ffn_up_exps.weight"][e] @ h, -clamp, clamp)
            routed = routed + w[f"{b}ffn_down_exps.weight"][e] @ (silu(g) * u * wk[k])
        g = np.minimum(w[f"{b}ffn_gate_shexp.weight"] @ h, clamp)
        u = np.clip(w[f"{b}ffn_up_shexp.weight"] @ h, -clamp, clamp)
        return routed + w[f"{b}ffn_down_shexp.weight"] @ (silu(g) * u)

    def step(self, t: int) -> np.ndarray:
        c, w = self.c, self.w
        p = self.p
        x0 = w["token_embd.weight"][t]
        R = np.stack([x0] * c.hc_count)
        for li in range(c.n_layers):
            x, post, C = self.hc_pre(R, f"blk.{li}.hc_attn")
            R = self.hc_post(R, self.attention(li, x, t, p), post, C)
            x, post, C = self.hc_pre(R, f"blk.{li}.hc_ffn")
            R = self.hc_post(R, self.ffn(li, x, t, p), post, C)
        flat = rms_norm(R.reshape(-1), None, c.rms_eps)
        pre = w["output_hc_fn.weight"] @ flat
        wts = sigmoid(pre * w["output_hc_scale.weight"][0] + w["output_hc_base.weight"]) + c.hc_eps
        e = sum(wts[i] * R[i] for i in range(c.hc_count))
        logits = w["output.weight"] @ rms_norm(e, w["output_norm.weight"], c.rms_eps)
        self.p += 1
        self.tokens.append(t)
        self.logits = logits
        return logits

    def run(self, tokens) -> np.ndarray:
        return np.stack([self.step(int(t)) for t in tokens])

    # -- state views comparable with the engine's canonical state
    def frontier_view(self, li: int, index: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(kv, score, rows that are meaningful) of a layer's frontier after self.p tokens."""
        st = (self.ifront if index else self.front)[li]
        r = 4 if index else self.c.ratios[li]
        T = self.p
        if r == 4:
            keep = np.zeros(8, dtype=bool)
            keep[4:4 + T % 4] = True
            keep[0:4] = T >= 4
        else:
            keep = np.zeros(r, dtype=bool)
            keep[: T % r] = True
        return st["kv"], st["sc"], keep
