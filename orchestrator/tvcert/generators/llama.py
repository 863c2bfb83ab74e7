"""Llama-3 training step: forward, backward, gradient sync, clipping, AdamW.

One function writes the step against a :class:`Par`; with all degrees 1 it is the logical
single-device graph, otherwise the SPMD program of Megatron-style parallelism:

* tp: column-parallel q/k/v/w1/w3 and LM head, row-parallel o/w2, vocab-parallel embedding and
  cross-entropy (one-hot formulation: the target logit and the embedding row are read through
  the rank's vocab block of a one-hot matrix; ``Cfg.masked_embedding``: Megatron's masked local
  lookup ``embedding(W_local, ids - rank*B)`` and its backward, the masked gradient scattered at
  the local ids, see ``embed_lookup`` / ``embed_grad``);
* sp (with tp): the residual stream is sharded on the sequence; all_gather before column-parallel
  layers, reduce_scatter after row-parallel ones, norm-weight gradients all-reduced over tp;
* cp: the sequence is sharded; RoPE positions and causal-mask rows are the rank's block of
  positions.  Attention either all-gathers K and V (Llama 3's all-gather context parallelism) or,
  with ``ring``, runs ring attention: a ``ring_loop`` over cp passes K, V and their positions
  to the next rank and folds each block in with the online-softmax merge (max-corrected running
  sum and accumulator), normalizing at the end.  Its backward is a second ring: probabilities
  recomputed from the forward's final (max, sum), dQ accumulated locally, dK and dV travelling
  with their K, V blocks until they are home.  With ``zigzag`` (load balancing) rank r holds sequence chunks
  r and 2cp-1-r (ZigzagShard(1) tokens; positions from ``zigzag_chunks``); all-gathered K, V are put back
  in natural order and their gradients paired before the reduce_scatter (``cp_gather`` / ``cp_scatter``);
* dp and micro-batches (a virtual mesh axis ``mb``: accumulation = sum over it): weight
  gradients are partial sums over the token-splitting axes and are all-reduced;
* zero=1: gradients reduce-scattered over dp on flattened parameters, AdamW on the owned
  shard, parameters all-gathered.
* tied embeddings (``Cfg.tie_embeddings``; Llama 3.2 1B/3B tie, 8B/70B/405B do not): the LM head
  is the embedding table transposed ([v, h] used as [h, v]; under tp both are vocab-sharded), and
  the table's gradient is the lookup gradient plus the transposed head gradient.  Under pp the
  table lives on stage 0 and the head on the last stage, as in Megatron's embedding group: the
  last stage's copy equals stage 0's at the start of the step (sent forward here, since a logical
  input binds one program), its head-gradient contribution is sent back to stage 0 and added to
  the lookup gradient *before* the gradient sync (all_reduce / ZeRO reduce_scatter), and stage 0
  applies the single update (the parameter output is bound there; the clip norm counts it once).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .builder import G, Par

EPS = 1e-5
ROPE_THETA = 500000.0
MASK = -1e9
B1, B2, LR, WD, ADAM_EPS, STEP, MAX_NORM = 0.9, 0.95, 3e-4, 0.1, 1e-8, 10, 1.0


@dataclass
class Cfg:
    dims: dict[str, int]  # b s h nh nkv hd f v
    layers: int
    tie_embeddings: bool = False  # LM head = embedding table transposed
    masked_embedding: bool = False  # Megatron's masked vocab-parallel lookup instead of the one-hot matmul

    @property
    def hd(self) -> int:
        return self.dims["hd"]


@dataclass
class Param:
    name: str
    shape: list
    tp_dim: int | None  # dim sharded over tp (None: replicated)
    grad: str = ""


@dataclass
class Step:
    g: G
    par: Par
    cfg: Cfg
    params: dict[str, Param] = field(default_factory=dict)
    rope_dim = "hd"  # the dim RoPE rotates (DeepSeek's MLA rotates a decoupled part)
    rope_theta = ROPE_THETA

    # -------------------------------------------------------------- dims
    def d(self, name: str, *axes: str) -> str:
        divs = [a for a in axes if self.par.has(a)]
        return name + "".join(f"/{a}" for a in divs)

    @property
    def B(self): return self.d("b", "dp", "mb")
    @property
    def S(self): return self.d("s", "cp")
    @property
    def SS(self): return self.d("s", "cp", "tp") if self.par.sp and self.par.has("tp") else self.S
    @property
    def NH(self): return self.d("nh", "tp")
    @property
    def NKV(self): return self.d("nkv", "tp")
    @property
    def F(self): return self.d("f", "tp")
    @property
    def V(self): return self.d("v", "tp")

    @property
    def sp(self) -> bool:
        return self.par.sp and self.par.has("tp")

    # -------------------------------------------------------------- collectives (identity when logical)
    def all_reduce(self, x, axes, role, reduce="sum"):
        axes = [a for a in axes if self.par.has(a)]
        if not axes:
            return x
        return self.g.op("all_reduce", x, role=role, axis=axes[0] if len(axes) == 1 else axes, reduce=reduce)

    def gather(self, x, axis, dim, role):
        return self.g.op("all_gather", x, role=role, axis=axis, dim=dim) if self.par.has(axis) else x

    def scatter(self, x, axis, dim, role):
        return self.g.op("reduce_scatter", x, role=role, axis=axis, dim=dim) if self.par.has(axis) else x

    def block(self, x, axis, dim, size, role):
        if not self.par.has(axis):
            return x
        return self.g.op("slice", x, role=role, dim=dim, start=f"rank.{axis}*({size}/{axis})",
                         end=f"(rank.{axis}+1)*({size}/{axis})")

    def cp_gather(self, x, dim, shape, role):
        """All-gather over cp.  With load-balanced chunks every rank sends chunks r and 2cp-1-r, so the gathered
        rows are put back in natural order: split (rank, half, rows), the first halves, then the second halves
        in reverse rank order (kernel pattern zigzag_all_gather).  ``shape``: the gathered tensor's shape."""
        gx = self.gather(x, "cp", dim, role)
        if not (self.par.zigzag and self.par.has("cp")):
            return gx
        g, pre, post, c = self.g, shape[:dim], shape[dim + 1:], "(s/(2*cp))"
        g3 = g.op("reshape", gx, role=role + ".chunks", shape=[*pre, "cp", 2, c, *post])
        h0 = g.op("slice", g3, role=role + ".first", dim=dim + 1, start=0, end=1)
        h1 = g.op("flip", g.op("slice", g3, role=role + ".second", dim=dim + 1, start=1, end=2),
                  role=role + ".second_in_order", dims=[dim])
        nat = g.op("concat", h0, h1, role=role + ".natural_chunks", dim=dim)
        return g.op("reshape", nat, role=role + ".natural", shape=list(shape))

    def cp_scatter(self, x, dim, shape, role):
        """Reduce-scatter over cp; with load-balanced chunks the rows are first put in zig-zag order (chunks r and
        2cp-1-r side by side for each r; kernel pattern zigzag_reduce_scatter).  ``shape``: x's shape."""
        if not (self.par.zigzag and self.par.has("cp")):
            return self.scatter(x, "cp", dim, role)
        g, pre, post, c = self.g, shape[:dim], shape[dim + 1:], "(s/(2*cp))"
        d3 = g.op("reshape", x, role=role + ".halves", shape=[*pre, 2, "cp", c, *post])
        d0 = g.op("slice", d3, role=role + ".first", dim=dim, start=0, end=1)
        d1 = g.op("flip", g.op("slice", d3, role=role + ".second", dim=dim, start=1, end=2),
                  role=role + ".second_reversed", dims=[dim + 1])
        t = g.op("transpose", g.op("concat", d0, d1, role=role + ".paired", dim=dim), role=role + ".by_rank",
                 dim0=dim, dim1=dim + 1)
        return self.scatter(g.op("reshape", t, role=role + ".zigzag", shape=list(shape)), "cp", dim, role)

    def zigzag_chunks(self, x, size, role):
        """Load-balanced context parallelism: cp rank r's chunks r and 2cp-1-r (of 2cp) of dim 0."""
        c = f"({size}/(2*cp))"
        head = self.g.op("slice", x, role=role + ".head", dim=0, start=f"rank.cp*{c}", end=f"(rank.cp+1)*{c}")
        tail = self.g.op("slice", x, role=role + ".tail", dim=0, start=f"(2*cp-1-rank.cp)*{c}",
                         end=f"(2*cp-rank.cp)*{c}")
        return self.g.op("concat", head, tail, role=role, dim=0)

    def tp_in(self, x, role):
        """Enter a column-parallel region (sequence all_gather under SP)."""
        return self.gather(x, "tp", 1, role + ".sp_all_gather") if self.sp else x

    def tp_out(self, x, role):
        """Leave a row-parallel region: all_reduce, or reduce_scatter on the sequence under SP."""
        if self.sp:
            return self.scatter(x, "tp", 1, role + ".sp_reduce_scatter")
        return self.all_reduce(x, ["tp"], role + ".all_reduce")

    # -------------------------------------------------------------- parameters
    def param(self, name, shape, tp_dim):
        local = list(shape)
        if tp_dim is not None:
            local[tp_dim] = self.d(shape[tp_dim], "tp")
        self.g.input(name, local)
        self.params[name] = Param(name, list(shape), tp_dim)
        self.stage_of[name] = getattr(self, "stage", 0)
        return name

    # -------------------------------------------------------------- building blocks
    def rmsnorm(self, x, w, role):
        g = self.g
        sq = g.op("square", x, role=role + ".sq")
        ms = g.op("mean", sq, role=role + ".mean", dims=[-1], keepdim=True)
        r = g.op("rsqrt", g.op("add_scalar", ms, role=role + ".eps", value=EPS), role=role + ".rsqrt")
        xn = g.op("mul", x, r, role=role + ".normalize")
        return g.op("mul", xn, w, role=role + ".weight"), (xn, r)

    def rmsnorm_bwd(self, dy, w, saved, role):
        g = self.g
        xn, r = saved
        dw = g.op("sum", g.op("mul", dy, xn, role=role + ".bwd.dw_mul"), role=role + ".bwd.dw_sum", dims=[0, 1])
        dxn = g.op("mul", dy, w, role=role + ".bwd.dxn")
        dot = g.op("mean", g.op("mul", dxn, xn, role=role + ".bwd.dot_mul"), role=role + ".bwd.dot_mean", dims=[-1],
                   keepdim=True)
        dx = g.op("mul", r, g.op("sub", dxn, g.op("mul", xn, dot, role=role + ".bwd.proj"), role=role + ".bwd.sub"),
                  role=role + ".bwd.dx")
        return dx, dw

    def rope(self, x, cos, sin, role, inverse=False):
        """x*cos + rot(x)*sin, rot(x) = [-x2, x1]; the backward applies rot^T(z) = [z2, -z1]."""
        g = self.g
        half, full = f"{self.rope_dim}/2", self.rope_dim
        if not inverse:
            x1 = g.op("slice", x, role=role + ".x1", dim=-1, start=0, end=half)
            x2 = g.op("slice", x, role=role + ".x2", dim=-1, start=half, end=full)
            rot = g.op("concat", g.op("neg", x2, role=role + ".neg"), x1, role=role + ".rot", dim=-1)
            return g.op("add", g.op("mul", x, cos, role=role + ".cos"), g.op("mul", rot, sin, role=role + ".sin"),
                        role=role + ".add")
        zs = g.op("mul", x, sin, role=role + ".bwd.sin")
        z1 = g.op("slice", zs, role=role + ".bwd.z1", dim=-1, start=0, end=half)
        z2 = g.op("slice", zs, role=role + ".bwd.z2", dim=-1, start=half, end=full)
        rt = g.op("concat", z2, g.op("neg", z1, role=role + ".bwd.neg"), role=role + ".bwd.rot_t", dim=-1)
        return g.op("add", g.op("mul", x, cos, role=role + ".bwd.cos"), rt, role=role + ".bwd.add")

    def rope_tables(self):
        g = self.g
        # inverse frequencies theta^(-2i/d) of the rotated dims, computed in-graph so every pipeline stage can
        # rebuild them
        d = self.rope_dim
        inv = g.op("exp", g.op("scale", g.op("cast", g.op("iota", role="rope.freq_iota", size=f"{d}/2"), role="rope.freq_i",
                                             dtype="float"), role="rope.freq_exponent",
                               value=-2.0 * math.log(self.rope_theta) / self.cfg.dims[d]), role="rope.inv_freq")
        it = g.op("iota", role="rope.iota", size="s")
        if self.par.zigzag and self.par.has("cp"):
            it = self.zigzag_chunks(it, "s", "rope.cp_positions")
        else:
            it = self.block(it, "cp", 0, "s", "rope.cp_positions")
        pos = g.op("cast", it, role="rope.pos", dtype="float")
        ang = g.op("matmul", g.op("unsqueeze", pos, role="rope.col", dim=1),
                   g.op("unsqueeze", inv, role="rope.row", dim=0), role="rope.angles")
        ang2 = g.op("concat", ang, ang, role="rope.angles2", dim=-1)
        rows = g.op("unsqueeze", pos, role="mask.rows", dim=1)
        cols = g.op("unsqueeze", g.op("cast", g.op("iota", role="mask.iota", size="s"), role="mask.colpos", dtype="float"),
                    role="mask.cols", dim=0)
        mask = g.op("gt", cols, rows, role="mask.causal")
        self.positions = pos  # this stage's query positions (the ring's key positions start as the same block)
        return g.op("cos", ang2, role="rope.cos"), g.op("sin", ang2, role="rope.sin"), mask

    def heads(self, x, n, role):
        g = self.g
        x4 = g.op("reshape", x, role=role + ".split_heads", shape=[self.B, self.S, n, "hd"])
        return g.op("permute", x4, role=role + ".to_bhsd", dims=[0, 2, 1, 3])

    def unheads(self, x, n, role):
        g = self.g
        x4 = g.op("permute", x, role=role + ".to_bshd", dims=[0, 2, 1, 3])
        return g.op("reshape", x4, role=role + ".merge_heads", shape=[self.B, self.S, f"{n}*hd"])

    def expand_kv(self, k, role, seq="s"):
        g = self.g
        k5 = g.op("unsqueeze", k, role=role + ".unsqueeze", dim=2)
        ke = g.op("expand", k5, role=role + ".expand", shape=[self.B, self.NKV, "nh/nkv", seq, "hd"])
        return g.op("reshape", ke, role=role + ".merge", shape=[self.B, self.NH, seq, "hd"])

    @property
    def ring(self) -> bool:
        return self.par.ring and self.par.has("cp")

    def attn_probs(self, q, k, v, mask, c):
        """All-gather K/V over cp, expand GQA groups, masked scaled scores, softmax: (ke, ve, prob)."""
        g = self.g
        kv = [self.B, self.NKV, "s", "hd"]
        kf = self.cp_gather(k, 2, kv, "cp_k_all_gather")
        vf = self.cp_gather(v, 2, kv, "cp_v_all_gather")
        ke, ve = self.expand_kv(kf, "k_gqa"), self.expand_kv(vf, "v_gqa")
        sc = g.op("scale", g.op("matmul", q, g.op("permute", ke, role="k_t", dims=[0, 1, 3, 2]), role="scores"),
                  role="scores_scale", value=c)
        sc = g.op("masked_fill", sc, mask, role="causal_mask", value=MASK)
        return ke, ve, g.op("softmax", sc, role="softmax", dim=-1)

    def ring_attention(self, q, k, v, c):
        """Llama: one score term q·kᵀ with GQA-expanded K and V."""
        S = self.S
        ke, ve = self.expand_kv(k, "ring.k_gqa", seq=S), self.expand_kv(v, "ring.v_gqa", seq=S)
        return self.ring_forward([(q, ke)], ve, c, "hd")

    def ring_attention_bwd(self, q, do, r, c):
        dqs, dks, dv = self.ring_backward([(q, r["keys"][0], False, "hd")], do, r, c, "hd")
        return dqs[0], dks[0], dv

    def ring_forward(self, terms, v, c, vdim):
        """Ring attention over cp: the keys (one per score term), V and the key positions travel the ring;
        scores scale(Σ_i q_i·k_iᵀ), causal mask from positions, online-softmax merge per block."""
        g, S = self.g, self.S
        rows = [self.B, self.NH, S, 1]
        m0 = g.op("const", role="ring.m0", value=-1e30, shape=rows)
        l0 = g.op("const", role="ring.l0", value=0, shape=rows)
        a0 = g.op("const", role="ring.acc0", value=0, shape=[self.B, self.NH, S, vdim])
        b = G()
        ks = [f"k{i}" for i in range(len(terms))]
        qs = [f"q{i}" for i in range(len(terms))]
        m, l, acc, vb, kp, qp = "m", "l", "acc", "v", "kpos", "qpos"
        prods = [b.op("matmul", qi, b.op("permute", ki, role=f"ring.k{i}_t", dims=[0, 1, 3, 2]), role=f"ring.scores{i}")
                 for i, (qi, ki) in enumerate(zip(qs, ks))]
        sc = prods[0] if len(prods) == 1 else b.op("add", *prods, role="ring.scores")
        sc = b.op("scale", sc, role="ring.scores_scale", value=c)
        msk = b.op("gt", b.op("unsqueeze", kp, role="ring.mask.cols", dim=0),
                   b.op("unsqueeze", qp, role="ring.mask.rows", dim=1), role="ring.mask.causal")
        sc = b.op("masked_fill", sc, msk, role="ring.causal_mask", value=MASK)
        mn = b.op("maximum", m, b.op("amax", sc, role="ring.block_max", dims=[-1], keepdim=True), role="ring.new_max")
        corr = b.op("exp", b.op("sub", m, mn, role="ring.max_shift"), role="ring.correction")
        e = b.op("exp", b.op("sub", sc, mn, role="ring.shift"), role="ring.exp")
        l2 = b.op("add", b.op("mul", l, corr, role="ring.l_rescale"), b.op("sum", e, role="ring.l_block", dims=[-1],
                                                                            keepdim=True), role="ring.l_merge")
        a2 = b.op("add", b.op("mul", acc, corr, role="ring.acc_rescale"), b.op("matmul", e, vb, role="ring.acc_block"),
                  role="ring.acc_merge")
        nxt = [b.op("ppermute", t, role=f"ring.pass_{t}", axis="cp", shift=1) for t in (*ks, vb, kp)]
        body = {"inputs": [m, l, acc, *ks, vb, kp, *qs, qp], "nodes": b.nodes, "outputs": [mn, l2, a2, *nxt]}
        n = 4 + len(terms) + 1
        keys = [kt for _, kt in terms]
        outs = g.multi("ring_loop", m0, l0, a0, *keys, v, self.positions, *[qt for qt, _ in terms], self.positions,
                       n=n, role="ring", axis="cp", carry=n, body=body)
        o = g.op("div", outs[2], outs[1], role="ring.normalize")
        return o, dict(keys=keys, v=v, m=outs[0], l=outs[1], oh=o, pos=self.positions)

    def ring_backward(self, terms, do, r, c, vdim):
        """Ring backward: P recomputed from the forward's final (m, l); dQ_i accumulate locally, dK_i and dV
        travel with their K_i, V blocks and are home after cp steps.  ``terms``: (q_i, k_i, whether k_i is
        shared by all heads (its gradient is summed over them), the head dim of q_i and k_i)."""
        g, S = self.g, self.S
        dmat = g.op("sum", g.op("mul", do, r["oh"], role="ring.bwd.do_o"), role="ring.bwd.D", dims=[-1], keepdim=True)
        b = G()
        n = len(terms)
        ks, qs = [f"k{i}" for i in range(n)], [f"q{i}" for i in range(n)]
        dqs, dks = [f"dq{i}" for i in range(n)], [f"dk{i}" for i in range(n)]
        vb, kp, dv, qp, dob, m, l, dd = "v", "kpos", "dv", "qpos", "do", "m", "l", "D"
        prods = [b.op("matmul", qi, b.op("permute", ki, role=f"ring.bwd.k{i}_t", dims=[0, 1, 3, 2]),
                      role=f"ring.bwd.scores{i}") for i, (qi, ki) in enumerate(zip(qs, ks))]
        sc = prods[0] if n == 1 else b.op("add", *prods, role="ring.bwd.scores")
        sc = b.op("scale", sc, role="ring.bwd.scores_scale", value=c)
        msk = b.op("gt", b.op("unsqueeze", kp, role="ring.bwd.mask.cols", dim=0),
                   b.op("unsqueeze", qp, role="ring.bwd.mask.rows", dim=1), role="ring.bwd.mask.causal")
        sc = b.op("masked_fill", sc, msk, role="ring.bwd.causal_mask", value=MASK)
        pr = b.op("div", b.op("exp", b.op("sub", sc, m, role="ring.bwd.shift"), role="ring.bwd.exp"), l,
                  role="ring.bwd.prob")
        dv2 = b.op("add", dv, b.op("matmul", b.op("permute", pr, role="ring.bwd.prob_t", dims=[0, 1, 3, 2]), dob,
                                   role="ring.bwd.dv_block"), role="ring.bwd.dv_acc")
        dp = b.op("matmul", dob, b.op("permute", vb, role="ring.bwd.v_t", dims=[0, 1, 3, 2]), role="ring.bwd.dprob")
        ds = b.op("mul", pr, b.op("sub", dp, dd, role="ring.bwd.dprob_minus_D"), role="ring.bwd.dscores")
        ds = b.op("masked_fill", ds, msk, role="ring.bwd.mask_bwd", value=0)
        ds = b.op("scale", ds, role="ring.bwd.scores_scale_bwd", value=c)
        dst = b.op("permute", ds, role="ring.bwd.dscores_t", dims=[0, 1, 3, 2])
        dq2 = [b.op("add", dqi, b.op("matmul", ds, ki, role=f"ring.bwd.dq{i}_block"), role=f"ring.bwd.dq{i}_acc")
               for i, (dqi, ki) in enumerate(zip(dqs, ks))]
        dk2 = []
        for i, (dki, qi, (_, _, shared, _)) in enumerate(zip(dks, qs, terms)):
            t = b.op("matmul", dst, qi, role=f"ring.bwd.dk{i}_block")
            if shared:
                t = b.op("sum", t, role=f"ring.bwd.dk{i}_sum_heads", dims=[1], keepdim=True)
            dk2.append(b.op("add", dki, t, role=f"ring.bwd.dk{i}_acc"))
        nxt = [b.op("ppermute", t, role=f"ring.bwd.pass_{nm}", axis="cp", shift=1)
               for t, nm in [(ki, ki) for ki in ks] + [(vb, "v"), (kp, "kpos")] + list(zip(dk2, dks)) + [(dv2, "dv")]]
        body = {"inputs": [*dqs, *ks, vb, kp, *dks, dv, *qs, qp, dob, m, l, dd], "nodes": b.nodes,
                "outputs": [*dq2, *nxt]}
        def zero(nm, heads, d):
            return g.op("const", role=f"ring.bwd.{nm}0", value=0, shape=[self.B, heads, S, d])

        z_dq = [zero(f"dq{i}", self.NH, d) for i, (_, _, _, d) in enumerate(terms)]
        z_dk = [zero(f"dk{i}", 1 if shared else self.NH, d) for i, (_, _, shared, d) in enumerate(terms)]
        z_dv = g.op("const", role="ring.bwd.dv0", value=0, shape=[self.B, self.NH, S, vdim])
        carry = 2 * n + 2 + n + 1
        outs = g.multi("ring_loop", *z_dq, *[kt for _, kt, _, _ in terms], r["v"], r["pos"], *z_dk, z_dv,
                       *[qt for qt, _, _, _ in terms], r["pos"], do, r["m"], r["l"], dmat,
                       n=carry, role="ring.bwd", axis="cp", carry=carry, body=body)
        return outs[:n], outs[2 * n + 2: 3 * n + 2], outs[3 * n + 2]

    def reduce_kv(self, dk, role, seq="s"):
        g = self.g
        d5 = g.op("reshape", dk, role=role + ".split", shape=[self.B, self.NKV, "nh/nkv", seq, "hd"])
        return g.op("sum", d5, role=role + ".sum_groups", dims=[2])

    def wgrad(self, x, dy, role):
        return self.g.op("einsum", x, dy, role=role, equation="bsi,bso->io")

    def linear_dx(self, dy, w, role):
        g = self.g
        return g.op("matmul", dy, g.op("permute", w, role=role + ".w_t", dims=[1, 0]), role=role)

    # -------------------------------------------------------------- the layer
    def layer(self, i, x, cos, sin, mask):
        g, p = self.g, f"layer{i}"
        wn1 = self.param(f"{p}.attn_norm", ["h"], None)
        wq = self.param(f"{p}.wq", ["h", "nh*hd"], 1)
        wk = self.param(f"{p}.wk", ["h", "nkv*hd"], 1)
        wv = self.param(f"{p}.wv", ["h", "nkv*hd"], 1)
        wo = self.param(f"{p}.wo", ["nh*hd", "h"], 0)
        wn2 = self.param(f"{p}.mlp_norm", ["h"], None)
        w1 = self.param(f"{p}.w1", ["h", "f"], 1)
        w3 = self.param(f"{p}.w3", ["h", "f"], 1)
        w2 = self.param(f"{p}.w2", ["f", "h"], 0)
        g.scope = p
        n1, sn1 = self.rmsnorm(x, wn1, "attn_norm")
        n1f = self.tp_in(n1, "attn_in")
        q = self.rope(self.heads(g.op("matmul", n1f, wq, role="q_proj"), self.NH, "q"), cos, sin, "q_rope")
        k = self.rope(self.heads(g.op("matmul", n1f, wk, role="k_proj"), self.NKV, "k"), cos, sin, "k_rope")
        v = self.heads(g.op("matmul", n1f, wv, role="v_proj"), self.NKV, "v")
        c = 1.0 / math.sqrt(self.cfg.hd)
        ring = None
        if self.ring:
            ke = ve = prob = None
            oh, ring = self.ring_attention(q, k, v, c)
            o = self.unheads(oh, self.NH, "o")
        else:
            ke, ve, prob = self.attn_probs(q, k, v, mask, c)
            o = self.unheads(g.op("matmul", prob, ve, role="attn_v"), self.NH, "o")
        attn = self.tp_out(g.op("matmul", o, wo, role="o_proj"), "o_proj")
        x2 = g.op("add", x, attn, role="attn_residual")
        n2, sn2 = self.rmsnorm(x2, wn2, "mlp_norm")
        n2f = self.tp_in(n2, "mlp_in")
        a = g.op("matmul", n2f, w1, role="w1_proj")
        cc = g.op("matmul", n2f, w3, role="w3_proj")
        sa = g.op("silu", a, role="silu")
        hm = g.op("mul", sa, cc, role="swiglu")
        mo = self.tp_out(g.op("matmul", hm, w2, role="w2_proj"), "w2_proj")
        x3 = g.op("add", x2, mo, role="mlp_residual")
        g.scope = ""
        saved = dict(x=x, n1f=n1f, sn1=sn1, q=q, k=k, v=v, ke=ke, ve=ve, prob=prob, o=o, ring=ring, x2=x2, sn2=sn2, n2f=n2f, a=a, cc=cc,
                     sa=sa, hm=hm, c=c)
        return x3, saved

    def layer_bwd(self, i, dx3, s, cos, sin, mask):
        g, p = self.g, f"layer{i}"
        g.scope = p + ".bwd"
        gr = {}
        # MLP
        dmo = self.tp_in(dx3, "w2_dy")
        gr[f"{p}.w2"] = self.wgrad(s["hm"], dmo, "w2_dw")
        dhm = self.linear_dx(dmo, f"{p}.w2", "w2_dx")
        dsa = g.op("mul", dhm, s["cc"], role="swiglu_dsilu")
        dcc = g.op("mul", dhm, s["sa"], role="swiglu_dw3")
        sig = g.op("sigmoid", s["a"], role="silu_sig")
        one_minus = g.op("add_scalar", g.op("neg", sig, role="silu_negsig"), role="silu_1m", value=1.0)
        dsilu = g.op("mul", sig, g.op("add_scalar", g.op("mul", s["a"], one_minus, role="silu_a1m"), role="silu_1p",
                                      value=1.0), role="silu_grad")
        da = g.op("mul", dsa, dsilu, role="silu_dx")
        gr[f"{p}.w1"] = self.wgrad(s["n2f"], da, "w1_dw")
        gr[f"{p}.w3"] = self.wgrad(s["n2f"], dcc, "w3_dw")
        dn2f = g.op("add", self.linear_dx(da, f"{p}.w1", "w1_dx"), self.linear_dx(dcc, f"{p}.w3", "w3_dx"),
                    role="mlp_dx_sum")
        dn2 = self.tp_out(dn2f, "mlp_dx")
        dx2n, gr[f"{p}.mlp_norm"] = self.rmsnorm_bwd(dn2, f"{p}.mlp_norm", s["sn2"], "mlp_norm")
        dx2 = g.op("add", dx3, dx2n, role="mlp_residual_grad")
        # attention
        dattn = self.tp_in(dx2, "o_dy")
        gr[f"{p}.wo"] = self.wgrad(s["o"], dattn, "wo_dw")
        do2 = self.linear_dx(dattn, f"{p}.wo", "wo_dx")
        do = self.heads(do2, self.NH, "do")
        if s["ring"] is not None:
            dq, dke, dve = self.ring_attention_bwd(s["q"], do, s["ring"], s["c"])
            dkf, dvf = self.reduce_kv(dke, "dk_gqa", seq=self.S), self.reduce_kv(dve, "dv_gqa", seq=self.S)
        else:
            dq, dkf, dvf = self.attn_bwd(do, s, mask)
        dq2 = self.unheads(self.rope(dq, cos, sin, "q_rope", inverse=True), self.NH, "dq")
        dk2 = self.unheads(self.rope(dkf, cos, sin, "k_rope", inverse=True), self.NKV, "dk")
        dv2 = self.unheads(dvf, self.NKV, "dv")
        gr[f"{p}.wq"] = self.wgrad(s["n1f"], dq2, "wq_dw")
        gr[f"{p}.wk"] = self.wgrad(s["n1f"], dk2, "wk_dw")
        gr[f"{p}.wv"] = self.wgrad(s["n1f"], dv2, "wv_dw")
        dn1f = g.op("add", g.op("add", self.linear_dx(dq2, f"{p}.wq", "wq_dx"), self.linear_dx(dk2, f"{p}.wk", "wk_dx"),
                                role="qk_dx_sum"), self.linear_dx(dv2, f"{p}.wv", "wv_dx"), role="qkv_dx_sum")
        dn1 = self.tp_out(dn1f, "attn_dx")
        dxn, gr[f"{p}.attn_norm"] = self.rmsnorm_bwd(dn1, f"{p}.attn_norm", s["sn1"], "attn_norm")
        dx = g.op("add", dx2, dxn, role="attn_residual_grad")
        g.scope = ""
        return dx, gr

    def attn_bwd(self, do, s, mask):
        """Attention backward with all-gathered K/V: dQ, and dK, dV reduce-scattered back over cp."""
        g = self.g
        dprob = g.op("matmul", do, g.op("permute", s["ve"], role="v_t", dims=[0, 1, 3, 2]), role="dprob")
        dve = g.op("matmul", g.op("permute", s["prob"], role="prob_t", dims=[0, 1, 3, 2]), do, role="dv")
        dsc = g.op("softmax_backward", dprob, s["prob"], role="softmax_bwd", dim=-1)
        dsc = g.op("masked_fill", dsc, mask, role="mask_bwd", value=0)
        dsc = g.op("scale", dsc, role="scores_scale_bwd", value=s["c"])
        dq = g.op("matmul", dsc, s["ke"], role="dq")
        dke = g.op("matmul", g.op("permute", dsc, role="dscores_t", dims=[0, 1, 3, 2]), s["q"], role="dk")
        kv = [self.B, self.NKV, "s", "hd"]
        dkf = self.cp_scatter(self.reduce_kv(dke, "dk_gqa"), 2, kv, "cp_dk_reduce_scatter")
        dvf = self.cp_scatter(self.reduce_kv(dve, "dv_gqa"), 2, kv, "cp_dv_reduce_scatter")
        return dq, dkf, dvf

    # -------------------------------------------------------------- whole step
    def stage_layers(self) -> list[list[int]]:
        pp, n = self.par.pp, self.cfg.layers
        return [list(range(s * n // pp, (s + 1) * n // pp)) for s in range(pp)]

    def on(self, s: int) -> G:
        """Switch emission to pipeline stage s's program."""
        self.g = self.gs[s]
        return self.g

    def p2p(self, x, src: int, dst: int, tag: str, shape: list, role: str):
        """send on stage src, recv on stage dst; returns the received tensor (identity without pipelining)."""
        if self.par.pp == 1:
            return x
        self.gs[src].raw({"op": "send", "inputs": [x], "attrs": {"axis": "pp", "to": dst, "tag": tag},
                          "src": f"pipeline.{role}.send"})
        return self.gs[dst].op("recv", role=f"pipeline.{role}.recv", axis="pp", src=src, tag=tag, shape=shape)

    def build(self):
        pp = self.par.pp
        self.gs = [self.g] + [G() for _ in range(pp - 1)]
        self.stage_of: dict[str, int] = {}
        layers = self.stage_layers()
        last = pp - 1
        tables, saved = {}, {}
        act = [self.B, self.SS, "h"]
        # forward, stage by stage
        x = None
        for st in range(pp):
            g = self.on(st)
            self.stage = st
            tables[st] = self.rope_tables()
            if st == 0:
                ids = g.input("tokens", [self.B, self.S], "int", "v")
                wemb = self.param("embedding", ["v", "h"], 0)
                x = self.tp_out(self.embed_lookup(ids, wemb), "embed")
            else:
                x = self.p2p(x, st - 1, st, f"act{st}", act, f"act{st}")
            for i in layers[st]:
                x, saved[i] = self.layer(i, x, *tables[st])
        g = self.on(last)
        tgt = g.input("targets", [self.B, self.S], "int", "v")
        wf = self.param("final_norm", ["h"], None)
        g.scope = "head"
        if self.tied:
            wout = self.tied_head_weight(wemb)
        else:
            wout = self.param("lm_head", ["h", "v"], 1)
        nf, snf = self.rmsnorm(x, wf, "final_norm")
        nff = self.tp_in(nf, "lm_in")
        logits = g.op("matmul", nff, wout, role="lm_head")
        # vocab-parallel cross-entropy
        m = self.all_reduce(g.op("amax", logits, role="ce.local_max", dims=[-1], keepdim=True), ["tp"], "ce.max",
                            reduce="max")
        ez = g.op("exp", g.op("sub", logits, m, role="ce.shift"), role="ce.exp")
        se = self.all_reduce(g.op("sum", ez, role="ce.local_sumexp", dims=[-1], keepdim=True), ["tp"], "ce.sumexp")
        lse = g.op("add", g.op("log", se, role="ce.log"), m, role="ce.lse")
        toh = self.block(g.op("one_hot", tgt, role="ce.one_hot", num_classes="v"), "tp", 2, "v", "ce.vocab_block")
        tl = self.all_reduce(g.op("sum", g.op("mul", logits, toh, role="ce.pick"), role="ce.local_target", dims=[-1],
                                  keepdim=True), ["tp"], "ce.target")
        tok = g.op("sub", lse, tl, role="ce.token_loss")
        ntok = g.op("const", role="loss.count", value="b*s")
        lsum = g.op("div", g.op("sum", tok, role="loss.sum", dims=[0, 1, 2]), ntok, role="loss.mean")
        loss = self.all_reduce(lsum, self.par.data_axes(), "loss.all_reduce")
        # backward of the mean loss
        dtok = g.op("div", g.op("const", role="loss.seed", value=1, shape=[1, 1, 1]), ntok, role="loss.grad")
        soft = g.op("div", ez, se, role="ce.softmax")
        dlogits = g.op("mul", g.op("sub", soft, toh, role="ce.bwd.sub"), dtok, role="ce.bwd.dlogits")
        grads: list[dict] = [{} for _ in range(pp)]
        if self.tied:
            # the head's contribution to the table's gradient, in the table's [v, h] layout
            head_dw = g.op("einsum", nff, dlogits, role="lm_head.dw", equation="bsi,bso->oi")
            dnf = self.tp_out(self.linear_dx(dlogits, wout, "lm_head.dx"), "lm_dx")
        else:
            grads[last]["lm_head"] = self.wgrad(nff, dlogits, "lm_head.dw")
            dnf = self.tp_out(self.linear_dx(dlogits, "lm_head", "lm_head.dx"), "lm_dx")
        dx, grads[last]["final_norm"] = self.rmsnorm_bwd(dnf, "final_norm", snf, "final_norm")
        g.scope = ""
        for st in reversed(range(pp)):
            self.on(st)
            self.stage = st
            if st < last:
                dx = self.p2p(dx, st + 1, st, f"grad{st}", act, f"grad{st}")
            for i in reversed(layers[st]):
                dx, gl = self.layer_bwd(i, dx, saved[i], *tables[st])
                grads[st].update(gl)
        g = self.on(0)
        demb = self.tp_in(dx, "embed.dy")
        grads[0]["embedding"] = self.embed_grad(ids, demb)
        if self.tied:
            grads[0]["embedding"] = self.tied_grad_sum(grads[0]["embedding"], head_dw)
        outs = self.sync_and_update(grads)
        return loss, outs

    # -------------------------------------------------------------- embedding lookup
    @property
    def masked(self) -> bool:
        return bool(getattr(self.cfg, "masked_embedding", False))

    def embed_lookup(self, ids, wemb):
        """The rank's contribution to the embedding rows (Partial over tp when the table is vocab-sharded).

        Default: one-hot formulation, the rank's vocab block of one_hot(ids) times its table rows.
        ``masked_embedding``: Megatron's VocabParallelEmbedding forward, ``embedding(W_local, ids - rank*B)``
        with tokens outside the rank's block [rank*B, rank*B + B) zeroed (the kernel's vocab_parallel_embedding
        pattern); the logical step is ``embedding(W, ids)``."""
        g = self.g
        if not self.masked:
            self._onehot = self.vocab_onehot(ids, "embed")
            return g.op("matmul", self._onehot, wemb, role="embed.lookup")
        if not self.par.has("tp"):
            return g.op("embedding", wemb, ids, role="embed.lookup")
        blk = "v/tp"
        lo = g.op("const", role="embed.vocab_lo", value=f"rank.tp*({blk})", dtype="int")
        hi = g.op("const", role="embed.vocab_hi", value=f"rank.tp*({blk})+{blk}", dtype="int")
        outside = g.op("logical_or", g.op("lt", ids, lo, role="embed.below"), g.op("ge", ids, hi, role="embed.above"),
                       role="embed.outside")
        lid = g.op("masked_fill", g.op("sub", ids, lo, role="embed.shift"), outside, role="embed.local_ids", value=0)
        self._masked_ids = (outside, lid)  # reused by the backward
        rows = g.op("embedding", wemb, lid, role="embed.lookup")
        return g.op("masked_fill", rows, g.op("unsqueeze", outside, role="embed.outside_rows", dim=-1),
                    role="embed.mask_rows", value=0)

    def vocab_onehot(self, ids, role):
        return self.block(self.g.op("one_hot", ids, role=role + ".one_hot", num_classes="v"), "tp", 2, "v",
                          role + ".vocab_block")

    def embed_grad(self, ids, demb):
        """The table's gradient from the lookup, from demb (the full-sequence output gradient, replicated
        over tp).  One-hot form: the rank's vocab block of one_hot(ids) contracted with demb.  Masked form
        (Megatron): the gradient of tokens outside the rank's block zeroed, scattered into the B local rows
        at the forward's local ids, ``embedding_backward(where(m, 0, demb), lid, B)`` (the kernel's
        vocab_parallel_embedding_backward pattern); the logical step is ``embedding_backward(demb, ids, v)``."""
        g = self.g
        if self.masked:
            if not self.par.has("tp"):
                return g.op("embedding_backward", demb, ids, role="embed.bwd.dw", num_weights="v")
            outside, lid = self._masked_ids
            gm = g.op("masked_fill", demb, g.op("unsqueeze", outside, role="embed.bwd.outside_rows", dim=-1),
                      role="embed.bwd.mask_grad", value=0)
            return g.op("embedding_backward", gm, lid, role="embed.bwd.dw", num_weights="v/tp")
        return g.op("einsum", self._onehot, demb, role="embed.bwd.dw", equation="bsv,bsh->vh")

    # -------------------------------------------------------------- tied embeddings
    @property
    def tied(self) -> bool:
        return bool(getattr(self.cfg, "tie_embeddings", False))

    def tied_head_weight(self, wemb):
        """The LM head of a tied model: the embedding table [v, h] (vocab-sharded over tp, Shard(0)) transposed
        to [h, v] (Shard(1), as a column-parallel head).  Under pp, the last stage's copy of the table is
        stage 0's (Megatron keeps the two copies identical; here stage 0 sends it at the start of the step)."""
        last = self.par.pp - 1
        table = self.p2p(wemb, 0, last, "tied_weight", [self.V, "h"], "tied_embedding.weight")
        return self.on(last).op("permute", table, role="lm_head.tied_t", dims=[1, 0])

    def tied_grad_sum(self, lookup_dw, head_dw):
        """Stage 0: lookup gradient + the head's contribution (sent from the last stage under pp, Megatron's
        embedding-group all-reduce), both still Partial over the data axes: the sum precedes the gradient
        sync, so ZeRO's reduce_scatter sees the full tied gradient."""
        last = self.par.pp - 1
        head = self.p2p(head_dw, last, 0, "tied_grad", [self.V, "h"], "tied_embedding.grad")
        g = self.on(0)
        prev, g.scope = g.scope, "embed.bwd"
        try:
            return g.op("add", lookup_dw, head, role="tied_grad_sum")
        finally:
            g.scope = prev

    # -------------------------------------------------------------- gradient sync, clipping, AdamW
    def sync_and_update(self, grads: list[dict]):
        """Sync gradients, clip by the global norm (summed across stages in the logical order), AdamW."""
        pp, last = self.par.pp, self.par.pp - 1
        synced: list[dict] = [{} for _ in range(pp)]
        total = None
        for st in reversed(range(pp)):
            g = self.on(st)
            g.scope = "optim"
            if st < last:
                total = self.p2p(total, st + 1, st, f"normsq{st}", [], "grad_norm_partial")
            for name, gt in grads[st].items():
                synced[st][name] = self.sync(name, gt)
                ssq = self.sumsq(name, synced[st][name])
                total = ssq if total is None else g.op("add", total, ssq, role=f"{name}.sumsq_acc")
        self.on(0)
        return self.clip_and_update(self.all_reduce(total, ["tp"], "grad_norm.all_reduce"), synced)

    def clip_and_update(self, total, synced: list[dict]):
        """On stage 0: clip coefficient from the global sum of squares; sent up the pipeline; AdamW everywhere."""
        g = self.on(0)
        norm = g.op("sqrt", total, role="grad_norm.sqrt")
        coef = g.op("minimum", g.op("div", g.op("const", role="grad_norm.max", value=MAX_NORM),
                                    g.op("add_scalar", norm, role="grad_norm.eps", value=1e-6), role="grad_norm.ratio"),
                    g.op("const", role="grad_norm.one", value=1.0), role="clip_coef")
        outs = {}
        for st in range(self.par.pp):
            g = self.on(st)
            g.scope = "optim"
            if st > 0:
                coef = self.p2p(coef, st - 1, st, f"coef{st}", [], "clip_coef")
            for name, gt in synced[st].items():
                outs[name] = (st, self.adamw(name, g.op("mul", gt, coef, role=f"{name}.clip")))
            g.scope = ""
        self.on(self.par.pp - 1)
        return outs

    def sync(self, name, gt):
        axes = self.par.data_axes()
        if self.sp and self.params[name].tp_dim is None and not name.startswith("embedding"):
            axes = ["tp"] + axes  # norm weights see sequence shards under SP
        if self._zero():
            return self.zero_scatter(gt, name, [a for a in axes if a != "dp"])
        return self.all_reduce(gt, axes, f"{name}.grad_all_reduce")

    def zero_scatter(self, gt, name, other_axes):
        """ZeRO-1: all_reduce over the other token-splitting axes, flatten, reduce_scatter over dp."""
        part = self.all_reduce(gt, other_axes, f"{name}.grad_all_reduce")
        flat = self.g.op("reshape", self._tp_first(part, name), role=f"{name}.grad_flatten",
                         shape=self._zero_flat_shape(name))
        return self.scatter(flat, "dp", self._zero_lead(name), f"{name}.grad_reduce_scatter")

    def sumsq(self, name, gt):
        """This gradient's sum of squares: partial over tp when tp-sharded; replicated ones count once (/tp)."""
        g = self.g
        ssq = g.op("sum", g.op("square", gt, role=f"{name}.sq"), role=f"{name}.sumsq",
                   dims=list(range(len(self._local_shape(name)))) if not self._zero() else
                   list(range(self._zero_lead(name) + 1)))
        if self._zero():
            ssq = self.all_reduce(ssq, ["dp"], f"{name}.sumsq_all_reduce")
        if self.params[name].tp_dim is None and self.par.has("tp"):
            ssq = g.op("div", ssq, g.op("const", role=f"{name}.tp_count", value="tp"), role=f"{name}.sumsq_dedup")
        return ssq

    def _zero(self) -> bool:
        return bool(self.par.zero) and self.par.has("dp")

    # -------------------------------------------------------------- placements the plan declares
    def zero_of(self, name: str) -> bool:
        """Is this parameter's optimizer state ZeRO-sharded?"""
        return self._zero()

    def data_placement(self) -> dict[str, str]:
        """Tokens and targets: batch split over dp and micro-batches, sequence over cp."""
        pl = {a: "Shard(0)" for a in ("dp", "mb") if self.par.has(a)}
        if self.par.has("cp"):
            pl["cp"] = "ZigzagShard(1)" if self.par.zigzag else "Shard(1)"
        return pl

    def param_placement(self, name: str) -> dict[str, str]:
        d = self.params[name].tp_dim
        return {"tp": f"Shard({d})"} if d is not None and self.par.has("tp") else {}

    def buffers(self) -> dict[str, int]:
        """Inputs that are not trained parameters, with the stage holding them."""
        return {}

    def _local_shape(self, name):
        return self.params[name].shape

    def _tp_first(self, x, name):
        d = self.params[name].tp_dim
        if d in (None, 0):
            return x
        n = len(self.params[name].shape)
        return self.g.op("permute", x, role=f"{name}.tp_dim_first", dims=[d] + [i for i in range(n) if i != d])

    def adamw(self, name, grad):
        g = self.g
        g.label = f"adamw.{name}"  # every parameter's update is a stage: equal-shaped ones share a canonical form
        try:
            return self._adamw(name, grad)
        finally:
            g.label = ""

    def _adamw(self, name, grad):
        g = self.g
        z = self._zero()
        m_in = g.input(f"{name}.exp_avg", self._state_shape(name))
        v_in = g.input(f"{name}.exp_avg_sq", self._state_shape(name))
        pr = name
        if z:
            flat = g.op("reshape", self._tp_first(name, name), role=f"{name}.param_flatten",
                        shape=self._zero_flat_shape(name))
            pr = self.block(flat, "dp", self._zero_lead(name), self._zero_numel(name), f"{name}.param_shard")
        m = g.op("add", g.op("scale", m_in, role=f"{name}.m_decay", value=B1),
                 g.op("scale", grad, role=f"{name}.m_new", value=1 - B1), role=f"{name}.m")
        v = g.op("add", g.op("scale", v_in, role=f"{name}.v_decay", value=B2),
                 g.op("scale", g.op("square", grad, role=f"{name}.g2"), role=f"{name}.v_new", value=1 - B2),
                 role=f"{name}.v")
        mh = g.op("scale", m, role=f"{name}.m_hat", value=1 / (1 - B1 ** STEP))
        vh = g.op("scale", v, role=f"{name}.v_hat", value=1 / (1 - B2 ** STEP))
        upd = g.op("div", mh, g.op("add_scalar", g.op("sqrt", vh, role=f"{name}.v_sqrt"), role=f"{name}.v_eps",
                                    value=ADAM_EPS), role=f"{name}.adam_dir")
        upd = g.op("add", upd, g.op("scale", pr, role=f"{name}.wd", value=WD), role=f"{name}.decayed")
        newp = g.op("sub", pr, g.op("scale", upd, role=f"{name}.lr", value=LR), role=f"{name}.update")
        if z:
            full = self.gather(newp, "dp", self._zero_lead(name), f"{name}.param_all_gather")
            local = self._local_param_shape(name)
            d = self.params[name].tp_dim
            if d not in (None, 0):
                perm_shape = [local[d]] + [x for i, x in enumerate(local) if i != d]
                full = g.op("reshape", full, role=f"{name}.param_unflatten", shape=perm_shape)
                inv = [0] * len(local)
                order = [d] + [i for i in range(len(local)) if i != d]
                for pos, src in enumerate(order):
                    inv[src] = pos
                newp = g.op("permute", full, role=f"{name}.param_restore", dims=inv)
            else:
                newp = g.op("reshape", full, role=f"{name}.param_unflatten", shape=local)
        return {name: newp, f"{name}.exp_avg": m, f"{name}.exp_avg_sq": v}

    def _local_param_shape(self, name):
        p = self.params[name]
        local = list(p.shape)
        if p.tp_dim is not None:
            local[p.tp_dim] = self.d(p.shape[p.tp_dim], "tp")
        return local

    def _flat_numel(self, name):
        return "*".join(f"({x})" for x in self._local_param_shape(name))

    def _state_shape(self, name):
        if self._zero():
            lead = self._zero_lead(name)
            return [*self._local_param_shape(name)[:lead], f"({self._zero_numel(name)})/dp"]
        return self._local_param_shape(name)

    # ZeRO views: a parameter is flattened whole (tp-sharded dim first), except an expert parameter, which
    # keeps its leading ep-sharded expert dim and has each local expert's weights flattened; the dp shard is
    # taken on the flattened dim.  (The kernel's reduce_scatter over dp cannot split a dim that the inner ep
    # axis already shards, so an expert block is not flattened across experts.)
    def _zero_lead(self, name) -> int:
        return 1 if ep_sharded(self, name) else 0

    def _zero_flat_shape(self, name) -> list:
        lead = self._zero_lead(name)
        return [*self._local_param_shape(name)[:lead], -1]

    def _zero_numel(self, name) -> str:
        lead = self._zero_lead(name)
        return "*".join(f"({x})" for x in self._local_param_shape(name)[lead:])


def state_layout(step: Step, name: str) -> list[dict]:
    """Layout of a ZeRO-sharded optimizer state: tp-sharded dim first, then flattened; an expert parameter
    keeps its expert dim ([ne, rest], Shard(0) over ep, Shard(1) over dp)."""
    p = step.params[name]
    if ep_sharded(step, name):
        return [{"op": "reshape", "attrs": {"shape": [p.shape[0], -1]}}]
    out = []
    if p.tp_dim not in (None, 0):
        n = len(p.shape)
        out.append({"op": "permute", "attrs": {"dims": [p.tp_dim] + [i for i in range(n) if i != p.tp_dim]}})
    out.append({"op": "reshape", "attrs": {"shape": [-1]}})
    return out


def ep_sharded(step: Step, name: str) -> bool:
    """Is this parameter sharded over an expert-parallel mesh axis (its dim 0; no tp sharding with it)?"""
    p = step.params[name]
    d = getattr(p, "ep_dim", None)
    if d is None or not step.par.has("ep"):
        return False
    if d != 0 or p.tp_dim is not None:
        raise ValueError(f"{name}: ZeRO state layout covers expert parameters sharded on dim 0 over ep only")
    return True
