"""DeepSeek-V2/V3 training step: MLA attention, MoE with shared + routed experts, expert parallelism.

Written once against a :class:`DPar` (a :class:`Par` with an ``ep`` axis), reusing the Llama-3
step's helpers (RMSNorm, SwiGLU pieces, vocab-parallel embedding / cross-entropy, clipping,
AdamW).  With every degree 1 it is the logical single-device step.

* MLA: low-rank q (``q_lora_rank``; absent for V2-Lite) and kv projections with their RMSNorms,
  decoupled RoPE: a per-head rope part of q and one rope key shared by all heads.  Under tp the
  up-projections (q_nope / q_rope / k_nope / v) are column-parallel by head, o is row-parallel;
  the down-projections and their norms are replicated, so their gradients (and the
  input-gradient through them) stay Partial over tp until the usual tp all_reduce /
  reduce_scatter of the attention input gradient, and their weight gradients are all-reduced
  over tp.  The fused up-projections of the model card are written as separate matrices per
  output (q_nope, q_rope, k_nope, v): the same linear map, column blocks of one matrix.
* MoE: router logits -> softmax (V2) or sigmoid (V3, plus the selection-only score-correction
  bias) -> top-k as a threshold mask (k-th largest value via topk + amin, then ``ge``), so the
  mask is computed identically on every rank that holds the token; gate weights = masked scores,
  normalized over the selected experts when the card says so, times the routed scaling factor.
  Routed experts in dense-dispatch form: dispatch[e, b, s, h] = mask * x, all_to_all over ``ep``
  from token-sharded to expert-sharded (expert weights Shard(0) over ep), per-expert SwiGLU by
  einsum over the expert dim, all_to_all back, combine weighted by the gate.  Shared experts are a
  dense SwiGLU (tp column/row parallel).  The first ``dense_layers`` layers have a dense MLP.
* ep is a data axis (it splits the batch, as in DeepSeek's EP-inside-DP): non-expert gradients
  are all-reduced over it; expert gradients are complete over ep (every token of the ep group
  reaches its expert) and are all-reduced over the other token-splitting axes only.
  When dp / micro-batches also shard the batch, the kernel's all_to_all rule (which needs the
  concat dim unsharded on every other axis) cannot move tokens sharded on the batch dim by both;
  the MoE block then views its tokens as [b, sc, s/sc] (sc = the cp / SP sequence shards, which
  stay on the sc dim; the logical step uses the same view), all-gathers over ep on the batch and
  takes its ep block of s/sc, and the all_to_all concatenates along that dim (one extra
  all_gather of the MoE input and output per layer compared with DeepSeek's dispatch).
* Pipeline stages, micro-batches and the cross-stage clip norm come from ``Step.build``; ZeRO-1
  shards the optimizer state of every parameter over dp.  Expert parameters are Shard(0) over ep
  and replicated over dp (and cp / micro-batches, and tp): their gradients are all-reduced over
  the token-splitting axes other than ep and dp, then reduce-scattered over dp (the
  expert-data-parallel group of their ep coordinate).  The ZeRO view of an expert parameter
  keeps the expert dim and flattens each expert's weights ([ne/ep, h*mf], dp shards dim 1): the
  mesh nests ep inside dp, and the kernel's reduce_scatter over dp cannot split a dim that the
  inner ep axis already shards, so the local expert block is not flattened across experts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .builder import G, Par
from .llama import MASK, Param, Step

# Model cards: DeepSeek-V2-Lite (16B), DeepSeek-V2 (236B), DeepSeek-V3 (671B).
# qr = q_lora_rank (0: none), kvr = kv_lora_rank, dn / dr = qk nope / rope head dims, dv = v head
# dim, ne / nsh / k = routed experts / shared experts / experts per token, mf = moe intermediate,
# f = dense intermediate (first_k_dense_replace layers), s = training sequence length.
DEEPSEEK = {
    "deepseek-v3-16b": dict(h=2048, layers=27, dense_layers=1, qr=0, kvr=512, dn=128, dr=64, dv=128, nh=16,
                            ne=64, nsh=2, k=6, mf=1408, f=10944, v=102400, s=4096,
                            score="softmax", norm_topk=False, rsf=1.0),
    "deepseek-v3-236b": dict(h=5120, layers=60, dense_layers=1, qr=1536, kvr=512, dn=128, dr=64, dv=128, nh=128,
                             ne=160, nsh=2, k=6, mf=1536, f=12288, v=102400, s=4096,
                             score="softmax", norm_topk=False, rsf=16.0),
    "deepseek-v3-671b": dict(h=7168, layers=61, dense_layers=3, qr=1536, kvr=512, dn=128, dr=64, dv=128, nh=128,
                             ne=256, nsh=1, k=8, mf=2048, f=18432, v=129280, s=4096,
                             score="sigmoid", norm_topk=True, rsf=2.5),
}
DS_MODELS = sorted(DEEPSEEK)
_NOT_DIMS = ("layers", "dense_layers", "score", "norm_topk", "rsf")
ROPE_THETA = 10000.0  # rope_theta of the V2 / V3 cards


@dataclass(frozen=True)
class DPar(Par):
    """Par with an expert-parallel axis ``ep`` (innermost in the mesh; it splits the batch)."""

    ep: int = 1

    @property
    def logical(self) -> bool:
        return super().logical and self.ep == 1

    def axes(self) -> list[str]:
        return super().axes() + (["ep"] if self.ep > 1 else [])

    def data_axes(self) -> list[str]:
        return super().data_axes() + (["ep"] if self.ep > 1 else [])


@dataclass
class DCfg:
    dims: dict[str, int]
    layers: int
    dense_layers: int
    q_lora: bool
    score: str  # softmax | sigmoid
    norm_topk: bool
    rsf: float
    moe_chunks: bool = False  # MoE tokens viewed as [b, sc, s/sc] (ep with dp / micro-batches)


@dataclass
class DParam(Param):
    ep_dim: int | None = None  # dim sharded over ep (experts)
    tp_partial: str = "sp"  # replicated over tp; gradient Partial over tp: "always" | "sp" (under SP only)


@dataclass
class DStep(Step):
    cfg: DCfg = None  # type: ignore[assignment]
    params: dict[str, DParam] = field(default_factory=dict)
    buffer_stage: dict[str, int] = field(default_factory=dict)  # non-trained inputs (router bias) -> stage

    # -------------------------------------------------------------- dims
    @property
    def B(self):
        return self.d("b", "dp", "mb", "ep")

    @property
    def ep(self) -> bool:
        return self.par.has("ep")

    @property
    def ep_gather(self) -> bool:
        """Batch dim also sharded by dp / mb: route by the sequence dim inside the MoE block.  A property of
        the plan (cfg), so the logical step uses the same [b, sc, s/sc, h] token view of the MoE block."""
        return self.cfg.moe_chunks

    @property
    def E(self):
        return self.d("ne", "ep")

    def param(self, name, shape, tp_dim, ep_dim=None, tp_partial="sp"):
        local = list(shape)
        if tp_dim is not None:
            local[tp_dim] = self.d(shape[tp_dim], "tp")
        if ep_dim is not None:
            local[ep_dim] = self.d(shape[ep_dim], "ep")
        self.g.input(name, local)
        self.params[name] = DParam(name, list(shape), tp_dim, ep_dim=ep_dim, tp_partial=tp_partial)
        self.stage_of[name] = getattr(self, "stage", 0)
        return name

    def _local_param_shape(self, name):
        p = self.params[name]
        local = list(p.shape)
        if p.tp_dim is not None:
            local[p.tp_dim] = self.d(p.shape[p.tp_dim], "tp")
        if p.ep_dim is not None:
            local[p.ep_dim] = self.d(p.shape[p.ep_dim], "ep")
        return local

    def _local_shape(self, name):
        return self._local_param_shape(name)

    rope_dim = "dr"  # RoPE rotates MLA's decoupled dims
    rope_theta = ROPE_THETA

    def heads_d(self, x, hd, role):
        g = self.g
        x4 = g.op("reshape", x, role=role + ".split_heads", shape=[self.B, self.S, self.NH, hd])
        return g.op("permute", x4, role=role + ".to_bhsd", dims=[0, 2, 1, 3])

    def unheads_d(self, x, hd, role):
        g = self.g
        x4 = g.op("permute", x, role=role + ".to_bshd", dims=[0, 2, 1, 3])
        return g.op("reshape", x4, role=role + ".merge_heads", shape=[self.B, self.S, f"{self.NH}*{hd}"])

    def t(self, x, role):
        return self.g.op("permute", x, role=role, dims=[0, 1, 3, 2])

    # -------------------------------------------------------------- SwiGLU MLP (dense layers, shared experts)
    def mlp_params(self, p, f):
        return (self.param(f"{p}.w1", ["h", f], 1), self.param(f"{p}.w3", ["h", f], 1),
                self.param(f"{p}.w2", [f, "h"], 0))

    def silu_grad(self, a, role):
        g = self.g
        sig = g.op("sigmoid", a, role=role + ".sig")
        one_minus = g.op("add_scalar", g.op("neg", sig, role=role + ".negsig"), role=role + ".1m", value=1.0)
        return g.op("mul", sig, g.op("add_scalar", g.op("mul", a, one_minus, role=role + ".a1m"), role=role + ".1p",
                                     value=1.0), role=role + ".grad")

    def mlp(self, n2, w, role):
        g = self.g
        w1, w3, w2 = w
        n2f = self.tp_in(n2, role + ".in")
        a = g.op("matmul", n2f, w1, role=role + ".w1_proj")
        cc = g.op("matmul", n2f, w3, role=role + ".w3_proj")
        sa = g.op("silu", a, role=role + ".silu")
        hm = g.op("mul", sa, cc, role=role + ".swiglu")
        out = self.tp_out(g.op("matmul", hm, w2, role=role + ".w2_proj"), role + ".w2_proj")
        return out, dict(n2f=n2f, a=a, cc=cc, sa=sa, hm=hm)

    def mlp_bwd(self, dy, w, s, role, gr):
        g = self.g
        w1, w3, w2 = w
        dmo = self.tp_in(dy, role + ".w2_dy")
        gr[w2] = self.wgrad(s["hm"], dmo, role + ".w2_dw")
        dhm = self.linear_dx(dmo, w2, role + ".w2_dx")
        dsa = g.op("mul", dhm, s["cc"], role=role + ".swiglu_dsilu")
        dcc = g.op("mul", dhm, s["sa"], role=role + ".swiglu_dw3")
        da = g.op("mul", dsa, self.silu_grad(s["a"], role + ".silu"), role=role + ".silu_dx")
        gr[w1] = self.wgrad(s["n2f"], da, role + ".w1_dw")
        gr[w3] = self.wgrad(s["n2f"], dcc, role + ".w3_dw")
        dn2f = g.op("add", self.linear_dx(da, w1, role + ".w1_dx"), self.linear_dx(dcc, w3, role + ".w3_dx"),
                    role=role + ".dx_sum")
        return self.tp_out(dn2f, role + ".dx")

    # -------------------------------------------------------------- MLA attention
    def mla_params(self, p):
        P = {"attn_norm": self.param(f"{p}.attn_norm", ["h"], None)}
        if self.cfg.q_lora:
            P["wq_a"] = self.param(f"{p}.wq_a", ["h", "qr"], None, tp_partial="always")
            P["q_a_norm"] = self.param(f"{p}.q_a_norm", ["qr"], None, tp_partial="always")
            qin = "qr"
        else:
            qin = "h"
        P["wq_nope"] = self.param(f"{p}.wq_nope", [qin, "nh*dn"], 1)
        P["wq_rope"] = self.param(f"{p}.wq_rope", [qin, "nh*dr"], 1)
        P["wkv_a"] = self.param(f"{p}.wkv_a", ["h", "kvr"], None, tp_partial="always")
        P["kv_a_norm"] = self.param(f"{p}.kv_a_norm", ["kvr"], None, tp_partial="always")
        P["wk_rope"] = self.param(f"{p}.wk_rope", ["h", "dr"], None, tp_partial="always")
        P["wk_nope"] = self.param(f"{p}.wk_nope", ["kvr", "nh*dn"], 1)
        P["wv"] = self.param(f"{p}.wv", ["kvr", "nh*dv"], 1)
        P["wo"] = self.param(f"{p}.wo", ["nh*dv", "h"], 0)
        return P

    def mla(self, x, P, cos, sin, mask):
        g = self.g
        n1, sn1 = self.rmsnorm(x, P["attn_norm"], "attn_norm")
        n1f = self.tp_in(n1, "attn_in")
        s: dict[str, Any] = dict(sn1=sn1, n1f=n1f)
        if self.cfg.q_lora:
            cq = g.op("matmul", n1f, P["wq_a"], role="q_a_proj")
            qsrc, s["scq"] = self.rmsnorm(cq, P["q_a_norm"], "q_a_norm")
        else:
            qsrc = n1f
        qn = self.heads_d(g.op("matmul", qsrc, P["wq_nope"], role="q_nope_proj"), "dn", "q_nope")
        qp = self.rope(self.heads_d(g.op("matmul", qsrc, P["wq_rope"], role="q_rope_proj"), "dr", "q_pe"), cos, sin,
                       "q_rope")
        ckv = g.op("matmul", n1f, P["wkv_a"], role="kv_a_proj")
        ckvn, s["sckv"] = self.rmsnorm(ckv, P["kv_a_norm"], "kv_a_norm")
        kn = self.heads_d(g.op("matmul", ckvn, P["wk_nope"], role="k_nope_proj"), "dn", "k_nope")
        v = self.heads_d(g.op("matmul", ckvn, P["wv"], role="v_proj"), "dv", "v")
        kp = g.op("unsqueeze", g.op("matmul", n1f, P["wk_rope"], role="k_rope_proj"), role="k_pe.shared_head", dim=1)
        kp = self.rope(kp, cos, sin, "k_rope")  # [B, 1, S, dr]: one rope key for all heads
        c = 1.0 / math.sqrt(self.cfg.dims["dn"] + self.cfg.dims["dr"])
        if self.ring:  # two score terms (nope, rope); the rope key is shared by all heads
            oh, ring = self.ring_forward([(qn, kn), (qp, kp)], v, c, "dv")
            o = self.unheads_d(oh, "dv", "o")
            s.update(ring=ring, kn=kn, kp=kp)
        else:
            knf = self.cp_gather(kn, 2, [self.B, self.NH, "s", "dn"], "cp_k_nope_all_gather")
            kpf = self.cp_gather(kp, 2, [self.B, 1, "s", "dr"], "cp_k_pe_all_gather")
            vf = self.cp_gather(v, 2, [self.B, self.NH, "s", "dv"], "cp_v_all_gather")
            sc = g.op("add", g.op("matmul", qn, self.t(knf, "k_nope_t"), role="scores_nope"),
                      g.op("matmul", qp, self.t(kpf, "k_pe_t"), role="scores_pe"), role="scores")
            sc = g.op("scale", sc, role="scores_scale", value=c)
            sc = g.op("masked_fill", sc, mask, role="causal_mask", value=MASK)
            prob = g.op("softmax", sc, role="softmax", dim=-1)
            o = self.unheads_d(g.op("matmul", prob, vf, role="attn_v"), "dv", "o")
            s.update(knf=knf, kpf=kpf, vf=vf, prob=prob)
        attn = self.tp_out(g.op("matmul", o, P["wo"], role="o_proj"), "o_proj")
        s.update(qsrc=qsrc, qn=qn, qp=qp, ckvn=ckvn, o=o, c=c)
        return attn, s

    def mla_bwd(self, dattn_in, P, s, cos, sin, mask, gr):
        g = self.g
        dattn = self.tp_in(dattn_in, "o_dy")
        gr[P["wo"]] = self.wgrad(s["o"], dattn, "wo_dw")
        do = self.heads_d(self.linear_dx(dattn, P["wo"], "wo_dx"), "dv", "do")
        if s.get("ring") is not None:
            (dqn, dqp), (dkn, dkp), dv = self.ring_backward([(s["qn"], s["kn"], False, "dn"), (s["qp"], s["kp"], True, "dr")],
                                                            do, s["ring"], s["c"], "dv")
        else:
            dqn, dqp, dkn, dkp, dv = self.mla_attn_bwd(do, s, mask)
        dqn2 = self.unheads_d(dqn, "dn", "dq_nope")
        dqp2 = self.unheads_d(self.rope(dqp, cos, sin, "q_rope", inverse=True), "dr", "dq_pe")
        dkn2 = self.unheads_d(dkn, "dn", "dk_nope")
        dv2 = self.unheads_d(dv, "dv", "dv")
        dkp2 = g.op("squeeze", self.rope(dkp, cos, sin, "k_rope", inverse=True), role="dk_pe.squeeze", dims=[1])
        gr[P["wq_nope"]] = self.wgrad(s["qsrc"], dqn2, "wq_nope_dw")
        gr[P["wq_rope"]] = self.wgrad(s["qsrc"], dqp2, "wq_rope_dw")
        gr[P["wk_nope"]] = self.wgrad(s["ckvn"], dkn2, "wk_nope_dw")
        gr[P["wv"]] = self.wgrad(s["ckvn"], dv2, "wv_dw")
        gr[P["wk_rope"]] = self.wgrad(s["n1f"], dkp2, "wk_rope_dw")
        dqsrc = g.op("add", self.linear_dx(dqn2, P["wq_nope"], "wq_nope_dx"),
                     self.linear_dx(dqp2, P["wq_rope"], "wq_rope_dx"), role="dq_src")
        dckvn = g.op("add", self.linear_dx(dkn2, P["wk_nope"], "wk_nope_dx"), self.linear_dx(dv2, P["wv"], "wv_dx"),
                     role="dckv_norm")
        dckv, gr[P["kv_a_norm"]] = self.rmsnorm_bwd(dckvn, P["kv_a_norm"], s["sckv"], "kv_a_norm")
        gr[P["wkv_a"]] = self.wgrad(s["n1f"], dckv, "wkv_a_dw")
        if self.cfg.q_lora:
            dcq, gr[P["q_a_norm"]] = self.rmsnorm_bwd(dqsrc, P["q_a_norm"], s["scq"], "q_a_norm")
            gr[P["wq_a"]] = self.wgrad(s["n1f"], dcq, "wq_a_dw")
            dq_in = self.linear_dx(dcq, P["wq_a"], "wq_a_dx")
        else:
            dq_in = dqsrc
        dn1f = g.op("add", g.op("add", dq_in, self.linear_dx(dckv, P["wkv_a"], "wkv_a_dx"), role="qkv_dx_sum"),
                    self.linear_dx(dkp2, P["wk_rope"], "wk_rope_dx"), role="attn_dx_sum")
        dn1 = self.tp_out(dn1f, "attn_dx")
        dxn, gr[P["attn_norm"]] = self.rmsnorm_bwd(dn1, P["attn_norm"], s["sn1"], "attn_norm")
        return dxn

    def mla_attn_bwd(self, do, s, mask):
        """MLA attention backward with all-gathered K/V: dQ parts, and dK parts, dV reduce-scattered over cp."""
        g = self.g
        dprob = g.op("matmul", do, self.t(s["vf"], "v_t"), role="dprob")
        dvf = g.op("matmul", self.t(s["prob"], "prob_t"), do, role="dv")
        dsc = g.op("softmax_backward", dprob, s["prob"], role="softmax_bwd", dim=-1)
        dsc = g.op("masked_fill", dsc, mask, role="mask_bwd", value=0)
        dsc = g.op("scale", dsc, role="scores_scale_bwd", value=s["c"])
        dsct = self.t(dsc, "dscores_t")
        dqn = g.op("matmul", dsc, s["knf"], role="dq_nope")
        dqp = g.op("matmul", dsc, s["kpf"], role="dq_pe")
        dknf = g.op("matmul", dsct, s["qn"], role="dk_nope")
        dkp_h = g.op("matmul", dsct, s["qp"], role="dk_pe_per_head")
        dkpf = g.op("sum", dkp_h, role="dk_pe_sum_heads", dims=[1], keepdim=True)
        dkn = self.cp_scatter(dknf, 2, [self.B, self.NH, "s", "dn"], "cp_dk_nope_reduce_scatter")
        dkp = self.cp_scatter(dkpf, 2, [self.B, 1, "s", "dr"], "cp_dk_pe_reduce_scatter")
        dv = self.cp_scatter(dvf, 2, [self.B, self.NH, "s", "dv"], "cp_dv_reduce_scatter")
        return dqn, dqp, dkn, dkp, dv

    # -------------------------------------------------------------- MoE
    def moe_params(self, p):
        P = {"shared": self.mlp_params(f"{p}.shared", "nsh*mf"),
             "router": self.param(f"{p}.router", ["h", "ne"], None)}
        for w, shape in (("w1", ["ne", "h", "mf"]), ("w3", ["ne", "h", "mf"]), ("w2", ["ne", "mf", "h"])):
            P[w] = self.param(f"{p}.experts.{w}", shape, None, ep_dim=0)
        return P

    @property
    def seq_split(self) -> list[str]:
        """Axes sharding the sequence of the residual stream (cp, and tp under SP)."""
        return [a for a in ("cp", "tp") if self.par.has(a) and (a == "cp" or self.sp)]

    def ep_in(self, x, role):
        """Token-sharded MoE input.  Gather mode: move the ep block from the batch to the sequence, viewed as
        [b, sc, s/sc, h] (sc = the sequence shards of cp / SP, which stay on dim 1) with ep on dim 2."""
        if not self.ep_gather:
            return x
        g = self.g
        full = self.gather(x, "ep", 0, role + ".ep_all_gather")
        chunks = g.op("reshape", full, role=role + ".seq_chunks",
                      shape=[self.d("b", "dp", "mb"), self.d("sc", *self.seq_split), "s/sc", "h"])
        return self.block(chunks, "ep", 2, "s/sc", role + ".ep_seq_block")

    def ep_out(self, x, role):
        if not self.ep_gather:
            return x
        g = self.g
        full = self.gather(x, "ep", 2, role + ".ep_all_gather")
        merged = g.op("reshape", full, role=role + ".seq_merge", shape=[self.d("b", "dp", "mb"), self.SS, "h"])
        return self.block(merged, "ep", 0, self.d("b", "dp", "mb"), role + ".ep_batch_block")

    def a2a(self, x, split, concat, role):
        if not self.ep:
            return x
        return self.g.op("all_to_all", x, role=role, axis="ep", split_dim=split, concat_dim=concat)

    @property
    def T(self) -> str:
        """Einsum letters of the MoE token dims: [b, s], or [b, c, t] (sequence chunks) in gather mode."""
        return "bct" if self.ep_gather else "bs"

    @property
    def tok_dim(self) -> int:
        """The token dim of the dispatch tensor [e, *tokens, h] that ep shards."""
        return 3 if self.ep_gather else 1

    def moe(self, n2, P):
        g, cfg = self.g, self.cfg
        so, ss = self.mlp(n2, P["shared"], "shared")
        xr = self.ep_in(n2, "moe_in")
        logits = g.op("matmul", xr, P["router"], role="router")
        if cfg.score == "softmax":
            sc = g.op("softmax", logits, role="gate.softmax", dim=-1)
            sel = sc
        else:
            sc = g.op("sigmoid", logits, role="gate.sigmoid")
            sel = g.op("add", sc, P["router_bias"], role="gate.select_bias")
        vals, _ = g.multi("topk", sel, n=2, role="gate.topk", k="k", dim=-1)
        thr = g.op("amin", vals, role="gate.kth_value", dims=[-1], keepdim=True)
        mask = g.op("cast", g.op("ge", sel, thr, role="gate.select"), role="gate.mask", dtype="float")
        w = g.op("mul", sc, mask, role="gate.masked")
        s: dict[str, Any] = dict(ss=ss, xr=xr, sc=sc, mask=mask)
        if cfg.norm_topk:
            z = g.op("sum", w, role="gate.norm_sum", dims=[-1], keepdim=True)
            w = g.op("div", w, z, role="gate.normalize")
            s.update(z=z, wn=w)
        gate = g.op("scale", w, role="gate.route_scale", value=cfg.rsf) if cfg.rsf != 1.0 else w
        td, T = self.tok_dim, self.T
        disp = g.op("einsum", mask, xr, role="dispatch", equation=f"{T}e,{T}h->e{T}h")
        de = self.a2a(disp, 0, td, "dispatch.all_to_all")
        h1 = g.op("einsum", de, P["w1"], role="experts.w1_proj", equation=f"e{T}h,ehf->e{T}f")
        h3 = g.op("einsum", de, P["w3"], role="experts.w3_proj", equation=f"e{T}h,ehf->e{T}f")
        sa = g.op("silu", h1, role="experts.silu")
        hm = g.op("mul", sa, h3, role="experts.swiglu")
        oe = g.op("einsum", hm, P["w2"], role="experts.w2_proj", equation=f"e{T}f,efh->e{T}h")
        out = self.a2a(oe, td, 0, "combine.all_to_all")
        y = g.op("einsum", out, gate, role="combine", equation=f"e{T}h,{T}e->{T}h")
        y = self.ep_out(y, "moe_out")
        s.update(gate=gate, de=de, h1=h1, h3=h3, sa=sa, hm=hm, out=out)
        return g.op("add", so, y, role="moe_sum"), s

    def moe_bwd(self, dy_in, P, s, gr):
        g, cfg = self.g, self.cfg
        dn2_shared = self.mlp_bwd(dy_in, P["shared"], s["ss"], "shared", gr)
        td, T = self.tok_dim, self.T
        dy = self.ep_in(dy_in, "moe_dy")
        dout = g.op("einsum", dy, s["gate"], role="combine.bwd.dout", equation=f"{T}h,{T}e->e{T}h")
        dgate = g.op("einsum", s["out"], dy, role="combine.bwd.dgate", equation=f"e{T}h,{T}h->{T}e")
        doe = self.a2a(dout, 0, td, "combine.bwd.all_to_all")
        gr[P["w2"]] = g.op("einsum", s["hm"], doe, role="experts.w2_dw", equation=f"e{T}f,e{T}h->efh")
        dhm = g.op("einsum", doe, P["w2"], role="experts.w2_dx", equation=f"e{T}h,efh->e{T}f")
        dsa = g.op("mul", dhm, s["h3"], role="experts.swiglu_dsilu")
        dh3 = g.op("mul", dhm, s["sa"], role="experts.swiglu_dw3")
        dh1 = g.op("mul", dsa, self.silu_grad(s["h1"], "experts.silu"), role="experts.silu_dx")
        gr[P["w1"]] = g.op("einsum", s["de"], dh1, role="experts.w1_dw", equation=f"e{T}h,e{T}f->ehf")
        gr[P["w3"]] = g.op("einsum", s["de"], dh3, role="experts.w3_dw", equation=f"e{T}h,e{T}f->ehf")
        dde = g.op("add", g.op("einsum", dh1, P["w1"], role="experts.w1_dx", equation=f"e{T}f,ehf->e{T}h"),
                   g.op("einsum", dh3, P["w3"], role="experts.w3_dx", equation=f"e{T}f,ehf->e{T}h"),
                   role="experts.dx_sum")
        ddisp = self.a2a(dde, td, 0, "dispatch.bwd.all_to_all")
        dxr = g.op("einsum", ddisp, s["mask"], role="dispatch.bwd.dx", equation=f"e{T}h,{T}e->{T}h")
        # gate backward: scale, normalization over the selected experts, mask, softmax / sigmoid
        dw = g.op("scale", dgate, role="gate.bwd.route_scale", value=cfg.rsf) if cfg.rsf != 1.0 else dgate
        if cfg.norm_topk:
            dot = g.op("sum", g.op("mul", dw, s["wn"], role="gate.bwd.dot_mul"), role="gate.bwd.dot_sum", dims=[-1],
                       keepdim=True)
            dw = g.op("div", g.op("sub", dw, dot, role="gate.bwd.sub"), s["z"], role="gate.bwd.normalize")
        dsc = g.op("mul", dw, s["mask"], role="gate.bwd.masked")
        if cfg.score == "softmax":
            dlog = g.op("softmax_backward", dsc, s["sc"], role="gate.bwd.softmax", dim=-1)
        else:
            one_m = g.op("add_scalar", g.op("neg", s["sc"], role="gate.bwd.neg"), role="gate.bwd.1m", value=1.0)
            dlog = g.op("mul", dsc, g.op("mul", s["sc"], one_m, role="gate.bwd.sig_grad"), role="gate.bwd.sigmoid")
        gr[P["router"]] = g.op("einsum", s["xr"], dlog, role="router_dw", equation=f"{T}i,{T}o->io")
        dxr = g.op("add", dxr, self.linear_dx(dlog, P["router"], "router_dx"), role="moe.dx_sum")
        dn2_routed = self.ep_out(dxr, "moe_dx")
        return g.op("add", dn2_shared, dn2_routed, role="mlp_dx_sum")

    # -------------------------------------------------------------- layers
    def is_moe(self, i) -> bool:
        return i >= self.cfg.dense_layers

    def layer(self, i, x, cos, sin, mask):
        g, p = self.g, f"layer{i}"
        P = self.mla_params(p)
        P["mlp_norm"] = self.param(f"{p}.mlp_norm", ["h"], None)
        if self.is_moe(i):
            P.update(self.moe_params(p))
            # V3 score-correction bias: selection only, not trained (an input buffer)
            P["router_bias"] = None
            if self.cfg.score == "sigmoid":
                P["router_bias"] = g.input(f"{p}.router_bias", ["ne"])
                self.buffer_stage[P["router_bias"]] = getattr(self, "stage", 0)
        else:
            P["mlp"] = self.mlp_params(f"{p}.mlp", "f")
        g.scope = p
        attn, s = self.mla(x, P, cos, sin, mask)
        x2 = g.op("add", x, attn, role="attn_residual")
        n2, s["sn2"] = self.rmsnorm(x2, P["mlp_norm"], "mlp_norm")
        if self.is_moe(i):
            mo, s["moe"] = self.moe(n2, P)
        else:
            mo, s["mlp"] = self.mlp(n2, P["mlp"], "mlp")
        x3 = g.op("add", x2, mo, role="mlp_residual")
        g.scope = ""
        s["P"] = P
        return x3, s

    def layer_bwd(self, i, dx3, s, cos, sin, mask):
        g, p = self.g, f"layer{i}"
        g.scope = p + ".bwd"
        gr: dict[str, str] = {}
        P = s["P"]
        if self.is_moe(i):
            dn2 = self.moe_bwd(dx3, P, s["moe"], gr)
        else:
            dn2 = self.mlp_bwd(dx3, P["mlp"], s["mlp"], "mlp", gr)
        dx2n, gr[P["mlp_norm"]] = self.rmsnorm_bwd(dn2, P["mlp_norm"], s["sn2"], "mlp_norm")
        dx2 = g.op("add", dx3, dx2n, role="mlp_residual_grad")
        dxn = self.mla_bwd(dx2, P, s, cos, sin, mask, gr)
        dx = g.op("add", dx2, dxn, role="attn_residual_grad")
        g.scope = ""
        return dx, gr

    # build(): Step.build (embedding, layers per pipeline stage, head, vocab-parallel CE, backward, p2p)

    # -------------------------------------------------------------- gradient sync, clipping, AdamW
    def sync_axes(self, name) -> list[str]:
        p = self.params[name]
        axes = [a for a in self.par.data_axes() if not (a == "ep" and p.ep_dim is not None)]
        if self.par.has("tp") and p.tp_dim is None and name != "embedding":
            if p.tp_partial == "always" or (p.tp_partial == "sp" and self.sp):
                axes = ["tp"] + axes
        return axes

    def data_placement(self) -> dict[str, str]:
        """Tokens: batch split over dp, micro-batches and ep (EP inside DP), sequence over cp."""
        pl = {a: "Shard(0)" for a in ("dp", "mb", "ep") if self.par.has(a)}
        if self.par.has("cp"):
            pl["cp"] = "ZigzagShard(1)" if self.par.zigzag else "Shard(1)"
        return pl

    def param_placement(self, name: str) -> dict[str, str]:
        p = self.params[name]
        pl = {}
        if p.tp_dim is not None and self.par.has("tp"):
            pl["tp"] = f"Shard({p.tp_dim})"
        if p.ep_dim is not None and self.par.has("ep"):
            pl["ep"] = f"Shard({p.ep_dim})"
        return pl

    def buffers(self) -> dict[str, int]:
        return dict(self.buffer_stage)

    def zero_of(self, name) -> bool:
        """ZeRO-1 shards every parameter's optimizer state over dp, expert parameters included: an expert's
        replicas are its ep coordinate's dp ranks (the expert-data-parallel group), so its gradient is
        reduce-scattered over dp, each local expert's weights flattened (see Step._zero_lead, state_layout)."""
        return Step._zero(self)

    def sync(self, name, gt):
        axes = self.sync_axes(name)
        if self.zero_of(name):
            return self.zero_scatter(gt, name, [a for a in axes if a != "dp"])
        return self.all_reduce(gt, axes, f"{name}.grad_all_reduce")

    def group_of(self, name) -> str:
        """Clip-norm group: replicated grads count once; tp-sharded ones are Partial over tp, experts over ep."""
        p = self.params[name]
        return "ep" if p.ep_dim is not None else ("tp" if p.tp_dim is not None else "rep")

    def sumsq(self, name, gt):
        g = self.g
        z = self.zero_of(name)
        ssq = g.op("sum", g.op("square", gt, role=f"{name}.sq"), role=f"{name}.sumsq",
                   dims=list(range(self._zero_lead(name) + 1)) if z else list(range(len(self.params[name].shape))))
        if z:
            ssq = self.all_reduce(ssq, ["dp"], f"{name}.sumsq_all_reduce")
        return ssq

    def sync_and_update(self, grads: list[dict]):
        """Sync, clip by the global norm (three running sums across stages: replicated, tp-, ep-partial), AdamW."""
        pp, last = self.par.pp, self.par.pp - 1
        synced: list[dict] = [{} for _ in range(pp)]
        totals: dict[str, str | None] = {"rep": None, "tp": None, "ep": None}
        for st in reversed(range(pp)):
            g = self.on(st)
            g.scope = "optim"
            if st < last:
                for k in totals:
                    if totals[k] is not None:
                        totals[k] = self.p2p(totals[k], st + 1, st, f"normsq_{k}{st}", [], f"grad_norm_{k}_partial")
            for name, gt in grads[st].items():
                synced[st][name] = self.sync(name, gt)
                ssq = self.sumsq(name, synced[st][name])
                k = self.group_of(name)
                totals[k] = ssq if totals[k] is None else g.op("add", totals[k], ssq, role=f"{name}.sumsq_acc")
        g = self.on(0)
        total = totals["rep"]
        for k in ("tp", "ep"):
            if totals[k] is not None:
                part = self.all_reduce(totals[k], [k], f"grad_norm.{k}_all_reduce")
                total = part if total is None else g.op("add", total, part, role=f"grad_norm.{k}_add")
        return self.clip_and_update(total, synced)


# ====================================================================== plan assembly
class DeepSeekGenError(ValueError):
    pass


def small_dims(par: DPar, q_lora: bool) -> dict[str, int]:
    tp, cp, ep = par.tp, par.cp, par.ep
    d = {"b": par.dp * par.mb * ep, "s": 2 * cp * (tp if par.sp else 1) * ep, "h": 4, "nh": 2 * tp, "kvr": 6,
         "dn": 2, "dr": 2, "dv": 2, "ne": 4 if ep <= 2 else 2 * ep, "nsh": 1, "k": 2, "mf": 2 * tp, "f": 2 * tp,
         "v": 3 * tp}
    if q_lora:
        d["qr"] = 4
    return d


def small_mesh(par: DPar) -> DPar:
    return DPar(tp=min(par.tp, 2), sp=par.sp, cp=min(par.cp, 2), dp=min(par.dp, 2), mb=min(par.mb, 3), zero=par.zero,
                pp=par.pp, ep=min(par.ep, 2), ring=par.ring, zigzag=par.zigzag)


def deepseek_plan(model: str, tp: int = 1, sp: bool = False, cp: int = 1, dp: int = 1, mb: int = 1, zero: int = 0,
                  ep: int = 1, layers: int | None = None, dims: dict[str, int] | None = None,
                  dense_layers: int | None = None, pp: int = 1, cp_style: str = "allgather") -> dict[str, Any]:
    from .plans import GenError, assemble, check_degrees, cp_flags, ring_label

    if model not in DEEPSEEK:
        raise GenError(f"unknown model {model!r}; known: {', '.join(DS_MODELS)}")
    check_degrees(tp=tp, sp=sp, cp=cp, dp=dp, microbatches=mb, zero=zero, ep=ep, pp=pp, cp_style=cp_style)
    par = DPar(tp=tp, sp=sp, cp=cp, dp=dp, mb=mb, zero=zero, pp=pp, ep=ep, **cp_flags(cp_style))
    card = dict(DEEPSEEK[model])
    nl = layers if layers is not None else card["layers"]
    if dense_layers is None:
        dense_layers = card["dense_layers"] if layers is None else min(card["dense_layers"], nl // 2)
    q_lora = card["qr"] > 0
    full = {"b": dp * mb * ep, **{k: v for k, v in card.items() if k not in _NOT_DIMS}}
    if not q_lora:
        full.pop("qr")
    if dims:
        for k in dims:
            if k not in full:
                raise GenError(f"--dims: {k!r} is not a model dim ({', '.join(full)})")
        full.update(dims)
    axes = par.axes()
    full.update({a: getattr(par, a) for a in axes})
    sm = small_mesh(par)
    run = small_dims(sm, q_lora)
    if ep > 1 and (dp > 1 or mb > 1):  # gather mode: sequence chunks = the cp / SP sequence shards
        full["sc"] = cp * (tp if sp else 1)
        run["sc"] = sm.cp * (sm.tp if sp else 1)
    run.update({a: getattr(sm, a) for a in axes})
    _check(full, par)
    if nl < pp:
        raise GenError(f"{nl} layers cannot fill {pp} pipeline stages")
    cfg = DCfg(full, nl, dense_layers, q_lora, card["score"], card["norm_topk"], card["rsf"],
               moe_chunks=ep > 1 and (dp > 1 or mb > 1))
    ring = ring_label(par)
    desc = (f"{model} training step ({nl} layers, {dense_layers} dense): tp={tp}{' +sp' if sp else ''} cp={cp}"
            f"{f' ({ring})' if ring else ''} dp={dp} pp={pp} microbatches={mb} zero={zero} ep={ep}")
    name = f"{model}-tp{tp}{'sp' if sp else ''}-cp{cp}{ring}-dp{dp}-pp{pp}-mb{mb}-z{zero}-ep{ep}-L{nl}"
    return assemble(DStep(G(), DPar(), cfg), DStep(G(), par, cfg), name, desc, full, run)


def _check(d: dict[str, int], par: DPar) -> None:
    from .plans import GenError, check_divisible, seq_needs

    if d["k"] > d["ne"]:
        raise GenError(f"top-k k={d['k']} exceeds the number of routed experts {d['ne']}")
    need = [("nh", "tp"), ("v", "tp"), ("f", "tp"), ("nsh*mf", "tp"), ("ne", "ep"), *seq_needs(par)]
    if par.ep > 1 and (par.dp > 1 or par.mb > 1):
        need.append(("s", "sc*ep"))
    if par.ep > 1 and par.zero and par.dp > 1:
        need.append(("h*mf", "dp"))  # ZeRO shards each expert's flattened weights over dp
    check_divisible(d, need)
    if d["dr"] % 2:
        raise GenError("rope head dim must be even (RoPE)")


