"""A FlashAttention-2-style tiled attention in NumPy, as a kernel would compute it.

The spec's own tiled adapter: it implements the backend interface (docs/interface.md)
without importing this project, so that the spec can be shown to pass a correct tiled
kernel and to catch the tile bugs planted in its subclasses (tests/known_bad/tiled_*.py).

- forward: query tiles of ``block_q`` rows, key tiles of ``block_k`` columns, an online
  softmax (running row max ``m``, row sum ``l``, unnormalised accumulator) and a final
  ``acc / l``; the row log-sum-exp ``lse = m + log l`` is kept for the backward pass;
- key and value rows are padded to a whole number of key tiles (zeros) and the padding
  is masked like any other disallowed key (``j < Lk``);
- causal (both alignments) and window tiles that no query of a query tile may see are
  skipped, never read;
- decode (Lq == 1): split-KV, the keys cut into chunks of ``split_k`` columns, each chunk
  giving (out, lse), merged with weights ``exp(lse_chunk - lse)``;
- backward (FA2): P recomputed from the saved lse, ``D = rowsum(dO * O)`` from the stored
  output, ``dS = P * (dP - D)``, looping over key tiles and the query tiles that see them;
- ``sdpa_lse`` returns that lse itself (``-inf`` for a row without keys);
- attention sinks (``sink``, one logit per query head, as gpt-oss): after the last key
  tile the sink joins the running state as one more score of value 0 (``m`` becomes
  ``max(m, sink)``, ``l`` gains ``exp(sink - m)``), and in split-KV it is one more chunk
  ``(0, sink)`` of the merge; the backward pass recomputes ``P`` from the lse that
  includes it, and ``d_sink = -sum_i exp(sink - lse_i) D_i``;
- variable lengths (``q_lengths``, ``kv_lengths``): each batch element b is its own
  problem of q_lengths[b] queries and kv_lengths[b] keys, as FlashAttention's varlen
  kernels take the sequences of ``cu_seqlens``: key tiles past a length are never read
  (the last tile that holds keys is read whole, its keys past the length masked), the
  bottom-right offset is that problem's own (kv_lengths[b] - q_lengths[b]), and the rows
  of padded queries, the gradients of padded keys and everything of an empty problem
  stay 0;
- float16 and bfloat16 are computed in float32 (P is rounded to the input dtype before
  the P V product, as FlashAttention does), float32 in float32, float64 in float64.

Policies, and why they hold:
- ``fully_masked_rows: zeros`` and ``neg_inf_bias_rows: zeros``: a row with no finite
  score keeps ``l = 0`` (the "safe" max 0 is used only inside exp) and ``acc / l`` is
  replaced by 0, as FlashAttention's ``Check_inf``;
- ``masked_key_nan: ignored``: disallowed scores are replaced by -inf in the tiles that are
  read, and a skipped tile is never read;
- ``padded_query_rows: zeros``: a padded query is outside its problem, its rows stay 0;
- ``masked_value_nan: propagates``: ``P V`` multiplies 0 by a NaN value in every tile that
  is read. A tile skipped by causal or window is never read, so a NaN value there does
  not propagate: the spec's NaN cases put their NaN in tiles that are read.
"""

from __future__ import annotations

import numpy as np

from attention_conformance.backends import rules

_OPS = ("softmax", "scores", "attention_weights", "sdpa", "sdpa_lse", "self_attention",
        "multi_head_attention", "sdpa_vjp")
_COMPUTE = {"float64": np.float64, "float32": np.float32,
            "float16": np.float32, "bfloat16": np.float32}
_CAUSAL = (None, "top_left", "bottom_right")
_NEG_INF = -np.inf


def _no_sink_with_lengths(sink):
    if sink is not None:
        raise NotImplementedError("tiled: a sink with q_lengths/kv_lengths")


def _swap(x):
    return np.swapaxes(x, -1, -2)


def _side(n):
    return None if n is None or n < 0 else n


def _pad_to(x, n, axis, value):
    extra = n - x.shape[axis]
    if extra <= 0:
        return x
    width = [(0, 0)] * x.ndim
    width[axis] = (0, extra)
    return np.pad(x, width, constant_values=value)


class Tiled:
    """FlashAttention-2-style tiled attention; block sizes are constructor parameters."""

    name = "tiled"
    dtypes = frozenset({"float64", "float32", "float16", "bfloat16"})
    block_q = 16
    block_k = 16

    def __init__(self, block_q=None, block_k=None, split_k=None):
        self.block_q = block_q or type(self).block_q
        self.block_k = block_k or type(self).block_k
        self.split_k = split_k or 2 * self.block_k
        self.versions = {"numpy": np.__version__}
        tiled = f"composed: tiled online softmax, blocks {self.block_q}x{self.block_k}"
        self.paths = {op: "composed: plain NumPy" for op in ("softmax", "scores")}
        self.paths.update({op: tiled for op in _OPS if op not in self.paths})
        self.policy = {
            "fully_masked_rows": "zeros",
            "neg_inf_bias_rows": "zeros",
            "masked_key_nan": "ignored",
            "masked_value_nan": "propagates",
            "accumulation": "float32",
            # a padded query (past q_lengths) gets output, weight and dq rows of 0
            "padded_query_rows": "zeros",
        }

    # ------------------------------------------------------------------ dtypes

    @staticmethod
    def _dtypes(x):
        dt = np.dtype(np.asarray(x).dtype)
        if dt.name not in _COMPUTE:
            raise NotImplementedError(f"tiled backend: dtype {dt.name} is not supported")
        return dt, np.dtype(_COMPUTE[dt.name])

    # ------------------------------------------------------------------ positions

    @staticmethod
    def _offset(lq, lk, causal):
        if causal not in _CAUSAL:
            raise ValueError(f"causal must be one of {_CAUSAL}, got {causal!r}")
        return lk - lq if causal == "bottom_right" else 0

    @staticmethod
    def _window_sides(causal, window):
        """(left, right) reach of a query position p: keys p - left .. p + right."""
        left, right = (None, None) if window is None else (_side(n) for n in window)
        if causal is not None:
            right = 0 if right is None else min(right, 0)
        return left, right

    def _tile_live(self, i0, i1, j0, j1, lq, lk, causal, window):
        """Whether some query of rows [i0, i1) may see some key of [j0, j1)."""
        off = self._offset(lq, lk, causal)
        left, right = self._window_sides(causal, window)
        lo, hi = i0 + off, i1 - 1 + off               # positions of the tile's queries
        if right is not None:
            lo = max(lo, j0 - right)                  # p + right >= j0
        if left is not None:
            hi = min(hi, j1 - 1 + left)               # p - left <= j1 - 1
        return lo <= hi

    def _key_tiles(self, i0, i1, lq, lk, causal, window, start=0, stop=None):
        stop = lk if stop is None else stop
        return [(j0, j0 + self.block_k) for j0 in range(start, stop, self.block_k)
                if self._tile_live(i0, i1, j0, min(j0 + self.block_k, lk), lq, lk,
                                   causal, window)]

    def _query_tiles(self, j0, j1, lq, lk, causal, window):
        return [(i0, min(i0 + self.block_q, lq)) for i0 in range(0, lq, self.block_q)
                if self._tile_live(i0, min(i0 + self.block_q, lq), j0, min(j1, lk), lq, lk,
                                   causal, window)]

    def _tile_allowed(self, i0, i1, j0, j1, lq, lk, causal, window, mask):
        """Boolean (*, i1 - i0, j1 - j0): key in bounds, causal, window, mask."""
        off = self._offset(lq, lk, causal)
        p = np.arange(i0, i1)[:, None] + off
        j = np.arange(j0, j1)[None, :]
        keep = j < lk
        left, right = self._window_sides(causal, window)
        if left is not None:
            keep = keep & (j >= p - left)
        if right is not None:
            keep = keep & (j <= p + right)
        if mask is not None:
            keep = keep & mask[..., i0:i1, j0:j1]
        return keep

    # ------------------------------------------------------------------ one tile

    def _tile_scores(self, q_t, k_t, scale, softcap):
        """(scores, tanh term of the softcap or None) of one tile: softcap(q k^T * scale)."""
        s = (q_t @ _swap(k_t)) * scale
        if softcap is None:
            return s, None
        c = s.dtype.type(softcap)
        t = np.tanh(s / c)
        return c * t, t

    def _bias_tile(self, bias, i0, i1, j0, j1):
        return bias[..., i0:i1, j0:j1]

    def _logits(self, st, q_t, k_t, i0, i1, j0, j1):
        """The masked logits of one tile and the softcap's tanh term."""
        s, t = self._tile_scores(q_t, k_t, st["scale"], st["softcap"])
        if st["bias"] is not None:
            s = s + self._bias_tile(st["bias"], i0, i1, j0, j1)
        keep = self._tile_allowed(i0, i1, j0, j1, st["lq"], st["lk"], st["causal"],
                                  st["window"], st["mask"])
        return np.where(keep, s, _NEG_INF), t

    @staticmethod
    def _safe(m):
        """The max used inside exp: 0 for a row with no finite score yet (Check_inf)."""
        return np.where(np.isneginf(m), 0, m)

    @staticmethod
    def _operand(x, st):
        """A backward GEMM's operand (P, dS) as the kernel holds it: here, as computed."""
        return x

    def _pv(self, p, v_t, st):
        """P V of one tile; P rounded to the input dtype first (FlashAttention's 2nd GEMM)."""
        if st["dt"] != st["ct"]:
            p = p.astype(st["dt"]).astype(st["ct"])
        return p @ v_t

    def _online_update(self, m, l, acc, s, v_t, st):
        """One key tile of the online softmax: (m, l, acc) after scores s and values v_t."""
        m_new = np.maximum(m, np.max(s, axis=-1))
        m_safe = self._safe(m_new)
        alpha = np.exp(m - m_safe)
        p = np.exp(s - m_safe[..., None])
        l = alpha * l + np.sum(p, axis=-1)
        acc = alpha[..., None] * acc + self._pv(p, v_t, st)
        return m_new, l, acc

    def _finish(self, m, l, acc):
        """(out, lse) from the running state; a row with l = 0 gives 0 and lse -inf."""
        empty = l == 0
        out = np.where(empty[..., None], 0, acc / np.where(empty, 1, l)[..., None])
        lse = np.where(empty, _NEG_INF, self._safe(m) + np.log(np.where(empty, 1, l)))
        return out, lse

    def _fold_sink(self, m, l, acc, sink):
        """The sink as one more score (its value 0) of the online softmax."""
        m_new = np.maximum(m, sink)
        m_safe = self._safe(m_new)
        alpha = np.exp(m - m_safe)
        return m_new, alpha * l + np.exp(sink - m_safe), alpha[..., None] * acc

    # ------------------------------------------------------------------ forward

    def _initial_max(self):
        return _NEG_INF

    def _forward_rows(self, st, i0, i1, start=0, stop=None, finish=None, sink=True):
        """(out, lse) of query rows [i0, i1) over keys [start, stop) (and the sink)."""
        q_t = st["q"][..., i0:i1, :]
        batch = q_t.shape[:-1]
        m = np.full(batch, self._initial_max(), dtype=st["ct"])
        l = np.zeros(batch, dtype=st["ct"])
        acc = np.zeros(batch + (st["v"].shape[-1],), dtype=st["ct"])
        for j0, j1 in self._key_tiles(i0, i1, st["lq"], st["lk"], st["causal"], st["window"],
                                      start, stop):
            s, _ = self._logits(st, q_t, st["k"][..., j0:j1, :], i0, i1, j0, j1)
            m, l, acc = self._online_update(m, l, acc, s, st["v"][..., j0:j1, :], st)
        if sink and st["sink"] is not None:
            m, l, acc = self._fold_sink(m, l, acc, st["sink"][..., i0:i1])
        return (finish or self._finish)(m, l, acc)

    def _finish_chunk(self, m, l, acc):
        """(out, lse) of one split-KV chunk (an empty chunk: 0 and -inf)."""
        return self._finish(m, l, acc)

    def _split_part(self, st, start, stop):
        return self._forward_rows(st, 0, 1, start, stop, finish=self._finish_chunk, sink=False)

    def _merge(self, outs, lses):
        """Split-KV merge: out = sum_c exp(lse_c - lse) out_c, lse = log sum_c exp(lse_c)."""
        lses = np.stack(lses)
        top = self._safe(np.max(lses, axis=0))
        total = np.sum(np.exp(lses - top), axis=0)
        lse = np.where(total == 0, _NEG_INF, top + np.log(np.where(total == 0, 1, total)))
        weights = np.exp(lses - self._safe(lse))
        out = sum(w[..., None] * o for w, o in zip(weights, outs))
        return out, lse

    def _forward(self, st):
        """(out, lse) of every query row: tile by tile, or split-KV for one query."""
        lq, lk = st["lq"], st["lk"]
        if lq == 1 and lk > self.split_k:
            parts = [self._split_part(st, c, min(c + self.split_k, lk))
                     for c in range(0, lk, self.split_k)]
            if st["sink"] is not None:       # the sink: one more chunk, of value 0
                parts.append((np.zeros_like(parts[0][0]), st["sink"]))
            return self._merge(*zip(*parts))
        parts = [self._forward_rows(st, i0, min(i0 + self.block_q, lq))
                 for i0 in range(0, lq, self.block_q)]
        out = np.concatenate([o for o, _ in parts], axis=-2)
        lse = np.concatenate([s for _, s in parts], axis=-1)
        return out, lse

    # ------------------------------------------------------------------ backward

    def _recompute_p(self, s, lse):
        """P = exp(s - lse) of one tile; 0 on rows without keys (lse = -inf)."""
        return np.where(np.isneginf(lse[..., None]), 0, np.exp(s - self._safe(lse)[..., None]))

    def _backward(self, st, out, lse, d_out):
        """FA2 backward: (dq, dk, dv) of the broadcast, head-expanded, padded inputs."""
        q, k, v = st["q"], st["k"], st["v"]
        o = out.astype(st["dt"]).astype(st["ct"])     # the output as the kernel stored it
        d = np.sum(d_out * o, axis=-1)
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        if st["sink"] is not None:             # the sink's value is 0: dP = 0, dS = -P D
            d_sink = -np.sum(np.exp(st["sink"] - lse) * d, axis=-1)
        for j0 in range(0, st["lk"], self.block_k):
            j1 = j0 + self.block_k
            k_t, v_t = k[..., j0:j1, :], v[..., j0:j1, :]
            for i0, i1 in self._query_tiles(j0, j1, st["lq"], st["lk"], st["causal"],
                                            st["window"]):
                s, t = self._logits(st, q[..., i0:i1, :], k_t, i0, i1, j0, j1)
                p = self._operand(self._recompute_p(s, lse[..., i0:i1]), st)
                do_t = d_out[..., i0:i1, :]
                dv[..., j0:j1, :] += _swap(p) @ do_t
                dp = do_t @ _swap(v_t)
                ds = p * (dp - d[..., i0:i1, None])
                if t is not None:
                    ds = ds * (1 - t * t)
                ds = self._operand(ds * st["scale"], st)
                dq[..., i0:i1, :] += ds @ k_t
                dk[..., j0:j1, :] += _swap(ds) @ q[..., i0:i1, :]
        return (dq, dk, dv) + ((d_sink,) if st["sink"] is not None else ())

    # ------------------------------------------------------------------ set-up

    @staticmethod
    def _expand_kv(x, q):
        """Repeat kv heads so that query head h reads kv head h // (Hq // Hkv)."""
        if q.ndim < 3 or x.ndim < 3:
            return x
        hq, hkv = q.shape[-3], x.shape[-3]
        if hkv in (1, hq) or hq % hkv:
            return x
        return np.repeat(x, hq // hkv, axis=-3)

    @staticmethod
    def _group_sum(g, shape):
        """Gradient of head-expanded kv summed back over each query group."""
        if g.shape == tuple(shape):
            return g
        hkv = shape[-3]
        return g.reshape(*g.shape[:-3], hkv, g.shape[-3] // hkv, *g.shape[-2:]).sum(axis=-3)

    @staticmethod
    def _unbroadcast(g, shape):
        lead = g.ndim - len(shape)
        if lead > 0:
            g = g.sum(axis=tuple(range(lead)))
        axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
        return g.sum(axis=axes, keepdims=True) if axes else g

    def _setup(self, q, k, v, *, mask, bias, causal, scale, softcap, window, d_out=None,
               sink=None, valid_k=None):
        """The state of one call: inputs broadcast, kv heads expanded, keys padded.

        valid_k: the keys are the first valid_k rows of k and v; the rows after them (up
        to the end of the last tile) are read with the tile and masked (j < valid_k)."""
        dt, ct = self._dtypes(q)
        q, k, v = (np.asarray(a).astype(ct) for a in (q, k, v))
        k_e, v_e = self._expand_kv(k, q), self._expand_kv(v, q)
        lq, lk = q.shape[-2], (k.shape[-2] if valid_k is None else valid_k)
        self._offset(lq, lk, causal)
        shapes = [q.shape[:-2], k_e.shape[:-2], v_e.shape[:-2]]
        if mask is not None:
            mask = np.asarray(mask)
            if mask.dtype != np.bool_:
                raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
        extra = [np.asarray(a) for a in (mask, bias) if a is not None]
        shapes += [a.shape[:-2] for a in extra if a.ndim > 2]
        if d_out is not None:
            shapes.append(np.asarray(d_out).shape[:-2])
        if sink is not None:
            shapes.append(np.shape(sink))
        batch = np.broadcast_shapes(*shapes)
        lkp = -(-lk // self.block_k) * self.block_k

        def keys(x):
            return _pad_to(np.broadcast_to(x, batch + x.shape[-2:])[..., :lkp, :], lkp, -2, 0)

        def scores_shaped(x, value):
            return None if x is None else _pad_to(
                np.broadcast_to(x, batch + (lq, lk)), lkp, -1, value)

        scale = ct.type(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
        st = dict(dt=dt, ct=ct, lq=lq, lk=lk, causal=causal, window=window, scale=scale,
                  softcap=softcap, q=np.broadcast_to(q, batch + q.shape[-2:]),
                  k=keys(k_e), v=keys(v_e), mask=scores_shaped(mask, True),
                  bias=scores_shaped(None if bias is None else np.asarray(bias).astype(ct), 0))
        st["sink"] = None if sink is None else np.broadcast_to(
            np.asarray(sink).astype(ct)[..., None], batch + (lq,))
        if d_out is not None:
            st["d_out"] = np.broadcast_to(np.asarray(d_out).astype(ct), batch + (lq, v.shape[-1]))
        return st

    def _attention(self, q, k, v, **kw):  # kw may hold valid_k (see _setup)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            st = self._setup(q, k, v, **kw)
            out, lse = self._forward(st)
        return out.astype(st["dt"]), lse.astype(rules.lse_dtype(st["dt"]))

    # ------------------------------------------------------------------ varlen

    @staticmethod
    def _problems(q, k, q_lengths, kv_lengths):
        """(b, q rows, k rows) of each batch element: its own problem, the first
        q_lengths[b] queries and kv_lengths[b] keys."""
        q, k = np.asarray(q), np.asarray(k)
        if q.ndim < 3 or k.ndim != q.ndim or k.shape[0] != q.shape[0]:
            raise ValueError("q_lengths and kv_lengths need q, k, v with a batch dim 0")
        batch, lq, lk = q.shape[0], q.shape[-2], k.shape[-2]
        ql = [lq] * batch if q_lengths is None else [int(n) for n in q_lengths]
        kl = [lk] * batch if kv_lengths is None else [int(n) for n in kv_lengths]
        if len(ql) != batch or len(kl) != batch or \
                any(not 0 <= a <= lq for a in ql) or any(not 0 <= b <= lk for b in kl):
            raise ValueError(f"lengths {ql}, {kl} do not fit batch {batch}, {lq} x {lk}")
        return [(b, slice(0, ql[b]), slice(0, kl[b])) for b in range(batch)]

    def _score_slice(self, x, q, k, b, rows, cols):
        """Batch element b's rows x cols of a mask or bias broadcast to the scores."""
        if x is None:
            return None
        x = np.asarray(x)
        lead = np.broadcast_shapes(q.shape[:-2], self._expand_kv(k, q).shape[:-2])
        x = np.broadcast_to(x, np.broadcast_shapes(x.shape, lead + (q.shape[-2], k.shape[-2])))
        return x[b][..., rows, cols]

    def _varlen(self, op, q, k, v, d_out, q_lengths, kv_lengths, mask, bias, **kw):
        """op on every batch element's own problem; padding and empty problems give 0."""
        dt, _ = self._dtypes(q)
        q, k = np.asarray(q), np.asarray(k)
        v = None if v is None else np.asarray(v)
        if op == "attention_weights":
            lead = np.broadcast_shapes(q.shape[:-2], self._expand_kv(k, q).shape[:-2])
            results = [np.zeros(lead + (q.shape[-2], k.shape[-2]), dtype=dt)]
        elif op == "sdpa":
            lead = np.broadcast_shapes(q.shape[:-2], self._expand_kv(v, q).shape[:-2])
            results = [np.zeros(lead + (q.shape[-2], v.shape[-1]), dtype=dt)]
        else:
            results = [np.zeros(x.shape, dtype=dt) for x in (q, k, v)]
        for b, rows, cols in self._problems(q, k, q_lengths, kv_lengths):
            if rows.stop == 0 or cols.stop == 0:
                continue                        # no query, or no key: rows of 0
            part = dict(kw, mask=self._score_slice(mask, q, k, b, rows, cols),
                        bias=self._score_slice(bias, q, k, b, rows, cols))
            qb = q[b][..., rows, :]
            if op == "attention_weights":
                results[0][b][..., rows, cols] = self.attention_weights(
                    qb, k[b][..., cols, :], **part)
                continue
            # the tiles that hold keys are read whole, as a padded-batch kernel reads
            # them: the keys after kv_lengths[b] in the last tile are masked, not skipped
            read = slice(0, -(-cols.stop // self.block_k) * self.block_k)
            kb, vb = k[b][..., read, :], v[b][..., read, :]
            if op == "sdpa":
                results[0][b][..., rows, :] = self._attention(qb, kb, vb, valid_k=cols.stop,
                                                              **part)[0]
            else:
                grads = self._vjp(qb, kb, vb, np.asarray(d_out)[b][..., rows, :],
                                  valid_k=cols.stop, **part)
                for result, grad, where in zip(results, grads, (rows, cols, cols)):
                    result[b][..., where, :] = grad
        return results[0] if op != "sdpa_vjp" else tuple(results)

    # ------------------------------------------------------------------ interface

    def softmax(self, x, axis=-1):
        dt, ct = self._dtypes(x)
        x = np.asarray(x).astype(ct)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(x - np.max(x, axis=axis, keepdims=True))
            return (e / np.sum(e, axis=axis, keepdims=True)).astype(dt)

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        """Score functions; scaled_dot scales q and k by sqrt(scale) each (PyTorch's math path)."""
        dt, ct = self._dtypes(q)
        q, k, w, u, v = (None if a is None else np.asarray(a).astype(ct) for a in (q, k, w, u, v))
        k = self._expand_kv(k, q)
        if kind == "dot":
            s = q @ _swap(k)
        elif kind == "scaled_dot":
            scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
            root = ct.type(np.sqrt(abs(scale)))
            s = (q * (root * ct.type(np.sign(scale)))) @ _swap(k * root)
        elif kind == "bilinear":
            s = q @ w @ _swap(k)
        elif kind == "additive":
            s = np.tanh((q @ u)[..., :, None, :] + (k @ w)[..., None, :, :]) @ v
        else:
            raise ValueError(f"unknown score kind {kind!r}")
        return s.astype(dt)

    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None, q_lengths=None,
                          kv_lengths=None):
        """The weights in one tile over every key: exp(s - m) / l, empty rows 0."""
        if q_lengths is not None or kv_lengths is not None:
            _no_sink_with_lengths(sink)
            return self._varlen("attention_weights", q, k, None, None, q_lengths,
                                kv_lengths, mask, bias, causal=causal, scale=scale,
                                softcap=softcap, window=window)
        q = np.asarray(q)
        v = np.zeros(np.asarray(k).shape[:-1] + (1,), dtype=q.dtype)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            st = self._setup(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale,
                             softcap=softcap, window=window, sink=sink)
            lk = st["lk"]
            s, _ = self._logits(st, st["q"], st["k"][..., :lk, :], 0, st["lq"], 0, lk)
            m = np.max(s, axis=-1, keepdims=True)
            if st["sink"] is not None:
                m = np.maximum(m, st["sink"][..., None])
            e = np.exp(s - self._safe(m))
            l = np.sum(e, axis=-1, keepdims=True)
            if st["sink"] is not None:
                l = l + np.exp(st["sink"][..., None] - self._safe(m))
            p = np.where(l == 0, 0, e / np.where(l == 0, 1, l))
        return p.astype(st["dt"])

    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None, q_lengths=None, kv_lengths=None):
        if q_lengths is not None or kv_lengths is not None:
            _no_sink_with_lengths(sink)
            return self._varlen("sdpa", q, k, v, None, q_lengths, kv_lengths, mask, bias,
                                causal=causal, scale=scale, softcap=softcap, window=window)
        return self._attention(q, k, v, mask=mask, bias=bias, sink=sink, causal=causal,
                               scale=scale, softcap=softcap, window=window)[0]

    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        return self._attention(q, k, v, mask=mask, bias=bias, sink=sink, causal=causal,
                               scale=scale, softcap=softcap, window=window)

    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None, q_lengths=None, kv_lengths=None):
        if q_lengths is not None or kv_lengths is not None:
            _no_sink_with_lengths(sink)
            return self._varlen("sdpa_vjp", q, k, v, d_out, q_lengths, kv_lengths, mask,
                                bias, causal=causal, scale=scale, softcap=softcap,
                                window=window)
        return self._vjp(q, k, v, d_out, mask=mask, bias=bias, sink=sink, causal=causal,
                         scale=scale, softcap=softcap, window=window)

    def _vjp(self, q, k, v, d_out, valid_k=None, **kw):
        """(dq, dk, dv) (and d_sink with a sink); with valid_k, dk and dv of the first
        valid_k keys."""
        q, k, v = (np.asarray(a) for a in (q, k, v))
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            sink = kw.get("sink")
            st = self._setup(q, k, v, d_out=d_out, valid_k=valid_k, **kw)
            out, lse = self._forward(st)
            dq, dk, dv, *d_sink = self._backward(st, out, lse, st["d_out"])
        lk = st["lk"]
        k, v = k[..., :lk, :], v[..., :lk, :]
        k_e_shape = self._expand_kv(k, q).shape
        dq = self._unbroadcast(dq, q.shape)
        dk = self._group_sum(self._unbroadcast(dk[..., :lk, :], k_e_shape), k.shape)
        dv = self._group_sum(self._unbroadcast(dv[..., :lk, :],
                                               self._expand_kv(v, q).shape), v.shape)
        grads = (dq, dk, dv) + tuple(self._unbroadcast(g, np.shape(sink)) for g in d_sink)
        return tuple(g.astype(st["dt"]) for g in grads)

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        dt, ct = self._dtypes(x)
        x, w_q, w_k, w_v = (np.asarray(a).astype(ct) for a in (x, w_q, w_k, w_v))
        return self._composed(x @ w_q, x @ w_k, x @ w_v, dt, mask=mask,
                              causal=causal).astype(dt)

    def _composed(self, q, k, v, dt, **kw):
        """Attention of projections kept in the compute dtype (no rounding in between)."""
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            st = self._setup(q, k, v, bias=None, scale=None, softcap=None, window=None, **kw)
            st["dt"] = dt
            out, _ = self._forward(st)
        return out

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        dt, ct = self._dtypes(query)
        query, key, value, w_q, w_k, w_v, w_o = (
            np.asarray(a).astype(ct) for a in (query, key, value, w_q, w_k, w_v, w_o))
        h, hkv = num_heads, num_kv_heads or num_heads
        if h % hkv:
            raise ValueError(f"num_heads {h} is not a multiple of num_kv_heads {hkv}")

        def split(x, n):
            if x.shape[-1] % n:
                raise ValueError(f"last dim {x.shape[-1]} is not divisible by {n} heads")
            return np.moveaxis(x.reshape(*x.shape[:-1], n, x.shape[-1] // n), -2, -3)

        q, k, v = split(query @ w_q, h), split(key @ w_k, hkv), split(value @ w_v, hkv)
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(f"query head dim {q.shape[-1]} != key head dim {k.shape[-1]}")
        out = np.moveaxis(self._composed(q, k, v, dt, mask=mask, causal=causal), -3, -2)
        out = out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])
        return (out @ w_o).astype(dt)


class Tiled16(Tiled):
    """Tiles of 16 queries by 16 keys (split-KV chunks of 32 keys)."""

    name = "tiled-16"
    block_q = 16
    block_k = 16


class Tiled64(Tiled):
    """Tiles of 64 queries by 64 keys (split-KV chunks of 128 keys)."""

    name = "tiled-64"
    block_q = 64
    block_k = 64


class TiledPrescaled(Tiled16):
    """Tiles of 16, with q and k each multiplied by sqrt(|scale|) before Q K^T (the sign
    of the scale on q), as ONNX's Attention defines it and some kernels do: a legitimate
    order of the same arithmetic, which rounds where the plain one may be exact. Every
    `exact` claim of the spec must hold for it too (D = rowsum(dO O) in the backward
    pass, as in every tiled adapter)."""

    name = "tiled-prescaled"

    def _tile_scores(self, q_t, k_t, scale, softcap):
        root = np.sqrt(np.abs(scale)).astype(q_t.dtype)
        sign = q_t.dtype.type(-1 if scale < 0 else 1)
        s = ((q_t * root) * sign) @ _swap(k_t * root)
        if softcap is None:
            return s, None
        c = s.dtype.type(softcap)
        t = np.tanh(s / c)
        return c * t, t


class TiledHalfRoundings(Tiled16):
    """Tiles of 16 with the roundings of FlashAttention on tensor cores: every product
    and sum accumulates in float32, but for float16 and bfloat16 the logits are rounded
    to the input dtype before the softmax, P before P V (as every tiled form here), and
    in the backward pass P before dV = P^T dO and dS before dQ = dS K and dK = dS^T Q.
    The float32 accumulation tier's plain computation rounds every intermediate result
    to the dtype (spec/tolerances.yaml), so its derived tolerance holds this kernel."""

    name = "tiled-half-roundings"

    @staticmethod
    def _operand(x, st):
        return x if st["dt"] == st["ct"] else x.astype(st["dt"]).astype(st["ct"])

    def _logits(self, st, q_t, k_t, i0, i1, j0, j1):
        s, t = super()._logits(st, q_t, k_t, i0, i1, j0, j1)
        return self._operand(s, st), t
