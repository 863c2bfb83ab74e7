"""Core ATen coverage of the PyTorch front end (issue 15 §1): each conversion against PyTorch's own op.

Per op: trace a small joint program (loss and gradients) with the tracer's decompositions, convert it, run the
IR with the reference interpreter's op semantics in float64, and compare with PyTorch's eager result (loss and
every gradient) on the same random float64 inputs.  Then end-to-end programs (a Megatron-style TP MLP with
LayerNorm and GELU, the same with DTensor, TP attention with F.scaled_dot_product_attention or a -inf
masked_fill): VERIFIED when correct, REFUTED with a realistic bug.  Ops with no exact conversion must be UNKNOWN
(TraceError kind "unsupported") naming the op.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.trace import (TraceError, _convert, _parse_inputs, _trace_joint, decompositions,  # noqa: E402
                                    int_bounds_of, trace_plan)
from tvcert.ops import Ctx, get_op, resolve_attrs  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples" / "torch"
sys.path.insert(0, str(EX))

D = torch.float64
aten = torch.ops.aten


# ---------------------------------------------------------------- harness
def ir_run(fn, inputs, params=()):
    """Trace fn(**inputs) -> loss jointly with the gradients of ``params``, convert, and run the IR in float64."""
    spec = {k: {"shape": list(v.shape), "dtype": "float64" if v.dtype.is_floating_point else "int",
                **({} if v.dtype.is_floating_point else {"range": 1 << 20}), "param": k in params}
            for k, v in inputs.items()}
    specs = _parse_inputs(spec, {})
    gm, _ = _trace_joint(fn, specs, [s.shape for s in specs])
    nodes, outs = _convert(gm, [s.name for s in specs], int_bounds=int_bounds_of(specs))  # as trace_plan
    ctx = Ctx()
    env = {k: v.detach().numpy().astype(np.float64 if v.dtype.is_floating_point else np.int64)
           for k, v in inputs.items()}
    for nd in nodes:
        sp = get_op(nd.op)
        for o, r in zip(nd.outputs, sp.eval([env[i] for i in nd.inputs], resolve_attrs(sp, nd.attrs, {}), ctx)):
            env[o] = np.asarray(r)
    return [env[o] for o in outs], nodes


def torch_run(fn, inputs, params=()):
    kw = {k: (v.detach().clone().requires_grad_(True) if k in params else v) for k, v in inputs.items()}
    loss = fn(**kw)
    if params:
        loss.backward()  # (not autograd.grad: reentrant checkpointing refuses it)
    gs = [kw[p].grad for p in params]
    return [loss.detach().numpy()] + [np.zeros(tuple(kw[p].shape)) if g is None else g.numpy()
                                      for p, g in zip(params, gs)]


def check(fn, inputs, params=(), tol=1e-9):
    """The converted program computes what PyTorch computes (loss and gradients); returns the IR op kinds."""
    got, nodes = ir_run(fn, inputs, params)
    want = torch_run(fn, inputs, params)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        assert np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True), (i, np.nanmax(np.abs(a - b)))
    return {n.op for n in nodes}


def unknown(fn, inputs, params=()):
    with pytest.raises(TraceError) as ei:
        ir_run(fn, inputs, params)
    assert ei.value.kind == "unsupported"
    return str(ei.value)


g = torch.Generator().manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, dtype=D, generator=g)


# ---------------------------------------------------------------- the decomposition table
def test_table_is_core_aten_minus_direct_conversions():
    t = decompositions()
    assert aten.stack.default in t and aten.unbind.int in t and aten.native_layer_norm_backward.default in t
    # converted directly (the engine's rules speak of these forms), so not decomposed
    for op in (aten.nll_loss_forward.default, aten._softmax_backward_data.default, aten.gelu_backward.default,
               aten.embedding_dense_backward.default, aten.masked_fill.Scalar):
        assert op not in t
    assert aten._scaled_dot_product_flash_attention_for_cpu_backward.default in t


# ---------------------------------------------------------------- per-op conversions
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_and_backward(affine):
    x, R = rnd(2, 3, 8), rnd(2, 3, 8)
    w, b = rnd(8), rnd(8)
    if affine:
        ops = check(lambda x, w, b, R: (F.layer_norm(x, (8,), w, b, 1e-5) * R).sum(), dict(x=x, w=w, b=b, R=R),
                    ("x", "w", "b"))
    else:
        ops = check(lambda x, R: (F.layer_norm(x, (3, 8)) * R).sum(), dict(x=x, R=R), ("x",))
    assert "rsqrt" in ops


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward(approximate):
    x = torch.cat([rnd(20) * 3, torch.zeros(2, dtype=D)])  # x = 0: the exact form's Phi(0) = 1/2 branch
    R = rnd(22)
    ops = check(lambda x, R: (F.gelu(x, approximate=approximate) * R).sum(), dict(x=x, R=R), ("x",))
    assert "gelu" in ops or "tanh" in ops


def _qkv(L=4, S=5, Hq=2, Hk=2):
    return dict(q=rnd(2, Hq, L, 8), k=rnd(2, Hk, S, 8), v=rnd(2, Hk, S, 8), R=rnd(2, Hq, L, 8))


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "masked_row", "scale", "gqa"])
def test_sdpa_math(case):
    kw = _qkv(L=5) if case == "causal" else _qkv(Hq=4) if case == "gqa" else _qkv()
    m = torch.rand(4, 5, generator=g) > 0.4
    if case == "masked_row":
        m[1] = False  # a query that sees no key: the math backend's _safe_softmax gives 0
    args = dict(is_causal=case == "causal", scale=0.3 if case == "scale" else None, enable_gqa=case == "gqa")
    if case in ("bool_mask", "masked_row"):
        kw["m"] = m.long()
        fn = lambda q, k, v, R, m: (F.scaled_dot_product_attention(q, k, v, attn_mask=m.bool(), **args) * R).sum()  # noqa: E731
    elif case == "float_mask":
        kw["m"] = rnd(4, 5)
        fn = lambda q, k, v, R, m: (F.scaled_dot_product_attention(q, k, v, attn_mask=m, **args) * R).sum()  # noqa: E731
    else:
        fn = lambda q, k, v, R: (F.scaled_dot_product_attention(q, k, v, **args) * R).sum()  # noqa: E731
    check(fn, kw, ("q", "k", "v"))


@pytest.mark.parametrize("causal", [False, True])
def test_fused_cpu_attention_kernel_and_backward(causal):
    """The fused CPU kernel called directly, and F.sdpa under the user's own sdpa_kernel(FLASH_ATTENTION)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kw = _qkv(L=5)
    check(lambda q, k, v, R: (aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)[0] * R).sum(),
          kw, ("q", "k", "v"))

    def user_flash(q, k, v, R):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return (F.scaled_dot_product_attention(q, k, v, is_causal=causal) * R).sum()

    check(user_flash, kw, ("q", "k", "v"))


@pytest.mark.parametrize("case", ["plain", "causal", "bias"])
def test_memory_efficient_attention_kernel_and_backward(case):
    """The memory-efficient kernel has no CPU implementation, so PyTorch's reference is F.sdpa (same function)."""
    kw = _qkv(L=5)
    causal = case == "causal"
    if case == "bias":
        kw["b"] = rnd(5, 5)
        ps = ("q", "k", "v", "b")
        mine = lambda q, k, v, R, b: (aten._scaled_dot_product_efficient_attention(q, k, v, b, False)[0] * R).sum()  # noqa: E731
        ref = lambda q, k, v, R, b: (F.scaled_dot_product_attention(q, k, v, attn_mask=b) * R).sum()  # noqa: E731
    else:
        ps = ("q", "k", "v")
        mine = lambda q, k, v, R: (aten._scaled_dot_product_efficient_attention(q, k, v, None, False, is_causal=causal)[0]  # noqa: E731
                                   * R).sum()
        ref = lambda q, k, v, R: (F.scaled_dot_product_attention(q, k, v, is_causal=causal) * R).sum()  # noqa: E731
    got, _ = ir_run(mine, kw, ps)
    for a, b in zip(got, torch_run(ref, kw, ps)):
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
def test_cuda_flash_attention_kernel_and_backward(causal):
    """The CUDA flash kernel called directly (it has a meta kernel, so it traces on CPU); reference: F.sdpa."""
    kw = _qkv(L=5)
    mine = lambda q, k, v, R: (aten._scaled_dot_product_flash_attention(q, k, v, is_causal=causal)[0] * R).sum()  # noqa: E731
    ref = lambda q, k, v, R: (F.scaled_dot_product_attention(q, k, v, is_causal=causal) * R).sum()  # noqa: E731
    got, _ = ir_run(mine, kw, ("q", "k", "v"))
    for a, b in zip(got, torch_run(ref, kw, ("q", "k", "v"))):
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-9, atol=1e-9)


def test_fused_cpu_attention_logsumexp_is_not_made_up():
    """The kernel's logsumexp output is not computed by the decomposition: reading it is UNKNOWN."""
    kw = _qkv()
    msg = unknown(lambda q, k, v, R: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[1].sum() + R.sum(), kw)
    assert "uninitialised" in msg


def test_cumsum():
    x, R = rnd(3, 5), rnd(3, 5)
    ops = check(lambda x, R: (x.cumsum(1) * R).sum() + (x.cumsum(0) * R).sum() + (x.cumsum(-1, dtype=D)).sum(),
                dict(x=x, R=R), ("x",))
    assert {"triu", "matmul"} <= ops
    check(lambda i, R: (i.cumsum(0) * R).sum(), dict(i=torch.tensor([3, -1, 4, 1, 5]), R=rnd(5)))


def test_vector_matrix_products_squeeze_in_place():
    """matmul's decomposition of a 1-D operand squeezes its mm result in place (aten.squeeze_); an in-place squeeze
    of a view of an input stays UNKNOWN (the rebinding would miss the alias)."""
    v, M, R = rnd(4), rnd(4, 3), rnd(3)
    check(lambda v, M, R: (torch.tanh(v @ M) * R).sum() + ((M.t() @ v) ** 2 * R).sum(), dict(v=v, M=M, R=R), ("v", "M"))
    assert "squeeze_" in unknown(lambda x, R: (x[0:1].squeeze_(0) * R).sum(), dict(x=rnd(2, 3), R=rnd(3)))


def test_max_min_dim_values_indices_and_ties():
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [2.0, 2.0, 0.0, 2.0], [-1.0, -4.0, -4.0, 0.5]], dtype=D)  # ties
    R3, R = rnd(3), rnd(3, 4)
    check(lambda x, R: (x.max(dim=1).values * R).sum() + (x.max(dim=1).indices * 1.0).sum(), dict(x=x, R=R3), ("x",))
    check(lambda x, R: (x.min(dim=1)[0] * R).sum() + (x.min(1)[1] * 10.0).sum(), dict(x=x, R=R3), ("x",))
    check(lambda x, R: (x.max(dim=0, keepdim=True)[0] * R).sum() + x.argmax(0).sum() * 1.0 + x.argmin() * 1.0,
          dict(x=x, R=R), ("x",))
    y = rnd(3, 4)
    check(lambda y: y.max() * 2 + y.min(), dict(y=y), ("y",))
    check(lambda x: x.max() + x.min(), dict(x=x), ("x",))  # ties: the gradient is split evenly


def test_stack_unbind():
    x, R = rnd(3, 5), rnd(3, 5)
    check(lambda x, R: (torch.stack([x, 2 * x, x.sin()], dim=1) * R.unsqueeze(1)).sum(), dict(x=x, R=R), ("x",))
    check(lambda x, R: sum((t * R[:, 0]).sum() * (i + 1) for i, t in enumerate(x.unbind(1))), dict(x=x, R=R), ("x",))


def test_index_tensor():
    x, R = rnd(3, 5), rnd(3, 5)
    check(lambda x, i, R: (x[:, i] * R).sum(), dict(x=x, i=torch.tensor([4, 0, -1, 2, 2]), R=R), ("x",))
    check(lambda x, i, j, R: (x[i, j] * R).sum(),
          dict(x=x, i=torch.tensor([0, 2, -3, 1]), j=torch.tensor([4, -1, 0, 4]), R=rnd(4)), ("x",))
    y = rnd(2, 3, 4, 5)
    check(lambda y, i, R: (y[:, i] * R).sum(), dict(y=y, i=torch.tensor([[2, 0], [1, 1]]), R=rnd(2, 2, 2, 4, 5)),
          ("y",))


def test_index_tensor_out_of_range_is_not_a_value():
    """An index PyTorch rejects (>= size or < -size) is out of range in the IR too, never read as some row."""
    from tvcert.ops.indexing import IndexRangeError

    with pytest.raises(IndexRangeError):
        ir_run(lambda x, i: x[i].sum(), dict(x=rnd(3, 2), i=torch.tensor([0, -4])), ("x",))


def test_scatter_index_put():
    x, R = rnd(3, 5), rnd(3, 5)
    ix = torch.randint(0, 5, (3, 4), generator=g)  # repeated indices
    check(lambda x, ix, R: (x.scatter(1, ix, 0.5) * R).sum(), dict(x=x, ix=ix, R=R), ("x",))
    s = rnd(3, 4)
    check(lambda x, ix, s, R: (x.scatter_add(1, ix, s) * R).sum(), dict(x=x, ix=ix, s=s, R=R), ("x", "s"))
    one = torch.randint(0, 5, (3, 1), generator=g)
    check(lambda x, ix, s, R: (x.scatter(1, ix, s) * R).sum(), dict(x=x, ix=one, s=rnd(3, 1), R=R), ("x", "s"))
    check(lambda x, i, v, R: (x.index_put((i,), v, accumulate=True) * R).sum(),
          dict(x=x, i=torch.tensor([0, 2, 0, -1]), v=rnd(4, 5), R=R), ("x", "v"))

    def setitem(x, i, R):
        y = x.clone()
        y[:, i] = 0.25
        return (y * R).sum()

    check(setitem, dict(x=x, i=torch.tensor([1, 3, 1]), R=R), ("x",))

    def inplace(x, ix, s, R):
        y = x * 1.5
        y.scatter_(1, ix, 0.25)
        y.scatter_add_(1, ix, s)
        return (y * R).sum()

    check(inplace, dict(x=x, ix=ix, s=s, R=R), ("x", "s"))


def test_sort_argsort_topk_and_their_scatter_backward():
    """sort = topk with k = n (ties: lower index first, as PyTorch's stable sort); their backward scatters at
    the indices, distinct along the dim, so scatter of a tensor is exact there.  (An unstable sort whose indices
    are read is UNKNOWN: tests/test_redteam_trace6.py.)"""
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [2.0, 2.0, 0.0, 2.0]], dtype=D)  # ties
    R = rnd(2, 4)
    for desc in (False, True):
        ops = check(lambda x, R: (x.sort(dim=1, descending=desc, stable=True).values * R).sum()
                    + (x.sort(dim=1, descending=desc, stable=True).indices * R).sum()
                    + (x.argsort(dim=0, stable=True) * 1.0).sum(),
                    dict(x=x, R=R), ("x",))
        assert "topk" in ops
    y = rnd(3, 6)
    check(lambda y, R: (torch.topk(y, 3, 1).values * R[:, :3]).sum() + (y.sort(dim=0, stable=True).values * R).sum(),
          dict(y=y, R=rnd(3, 6)), ("y",))


def test_scatter_at_topk_indices_of_another_dim_is_unknown():
    """Distinct along dim 1 says nothing about dim 0: no exact conversion."""
    def f(y, s):
        idx = torch.topk(y, 3, 1).indices  # distinct along dim 1
        return y.scatter(0, idx, s).sum()

    msg = unknown(f, dict(y=rnd(3, 6), s=rnd(3, 3)), ("y",))
    assert "aten.scatter.src" in msg


def test_scatter_of_a_tensor_with_repeated_targets_is_unknown():
    msg = unknown(lambda x, ix, s: x.scatter(1, ix, s).sum(),
                  dict(x=rnd(3, 5), ix=torch.randint(0, 5, (3, 4), generator=g), s=rnd(3, 4)))
    assert "aten.scatter.src" in msg and "unspecified" in msg
    msg = unknown(lambda x, i, v: x.index_put((i,), v).sum(), dict(x=rnd(3, 5), i=torch.tensor([0, 0]), v=rnd(2, 5)))
    assert "index_put" in msg


def test_embedding_backward_padding_idx():
    W, ids, R = rnd(6, 4), torch.tensor([[0, 2, 5], [2, 2, 1]]), rnd(2, 3, 4)
    ops = check(lambda W, ids, R: (F.embedding(ids, W, padding_idx=2) * R).sum(), dict(W=W, ids=ids, R=R), ("W",))
    assert "embedding_backward" in ops


def test_var_std_logsumexp():
    x, R3 = rnd(3, 5), rnd(3)
    check(lambda x, R: (torch.var_mean(x, 1)[0] * R).sum() + x.std() + x.var(0, unbiased=False).sum(),
          dict(x=x, R=R3), ("x",))
    check(lambda x, R: (torch.logsumexp(x, 1) * R).sum(), dict(x=x, R=R3), ("x",))


def test_activation_checkpoint_recompute():
    from torch.utils.checkpoint import checkpoint

    x, w, R = rnd(3, 5), rnd(5, 5), rnd(3, 5)
    for reentrant in (False, True):  # reentrant: autograd.grad is refused, the tracer uses .backward()
        check(lambda x, w, R: (checkpoint(lambda a: F.gelu(a @ w), x, use_reentrant=reentrant) * R).sum(),
              dict(x=x, w=w, R=R), ("x", "w"))


_MORE = {
    "log1p": lambda x: torch.log1p(x.abs()), "expm1": torch.expm1, "sign": lambda x: torch.sign(x) * x,
    "pad": lambda x: F.pad(x, (1, 2)), "pad_value_crop": lambda x: F.pad(x, (1, -2, -1, 1), value=0.5),
    "repeat": lambda x: x.repeat(2, 1, 3), "roll": lambda x: torch.roll(x, (1, -2), (0, 1)) + torch.roll(x, 3),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1), "hardtanh": F.hardtanh, "relu6": lambda x: F.relu6(3 * x),
    "elu": F.elu, "selu": F.selu, "softplus": F.softplus, "mish": F.mish, "hardswish": F.hardswish,
    "logsigmoid": F.logsigmoid, "clamp_tensor": lambda x: torch.clamp(x, min=x[0], max=x[1] + 1),
    "bce_logits": lambda x: F.binary_cross_entropy_with_logits(x, torch.sigmoid(x.detach())) * x,
    "huber": lambda x: F.huber_loss(x, x * 0.5) * x, "l1": lambda x: F.l1_loss(x, x * 0.3) * x,
    "norms": lambda x: torch.linalg.vector_norm(x, dim=1, keepdim=True) * x + x.norm(1) + x.norm(float("inf"))
    + torch.linalg.vector_norm(x, 3, dim=0),
    "normalize": lambda x: F.normalize(x, dim=-1), "cosine": lambda x: F.cosine_similarity(x, x.flip(0)),
    "rms_norm": lambda x: F.rms_norm(x, (5,)), "group_norm": lambda x: F.group_norm(x.reshape(1, 3, 5), 3),
    "group_norm_affine": lambda x: F.group_norm(x.reshape(1, 3, 5), 1, x[0, :3], x[1, :3]),
    "batch_norm": lambda x: F.batch_norm(x, None, None, x[0], x[1], training=True),
}


@pytest.mark.parametrize("name", sorted(_MORE))
def test_more_core_ops(name):
    """Elementwise / norm / loss ops of the core set, including the in-place clamp_min_ of cosine_similarity
    (a conversion that once read clamp_min_ as clamp_max: caught here)."""
    f = _MORE[name]
    x = rnd(3, 5)
    R = rnd(*f(x).shape) if f(x).dim() else torch.ones((), dtype=D)
    check(lambda x, R: (f(x) * R).sum(), dict(x=x, R=R), ("x",))


@pytest.mark.parametrize("name,fn", [("aten.erf", torch.erf), ("aten.atan", torch.atan), ("aten.exp2", torch.exp2),
                                     ("aten.log2", torch.log2), ("aten.prod", lambda x: x.prod(1)),
                                     ("aten.pow.Tensor_Tensor", lambda x: x ** x),
                                     ("native_batch_norm", lambda x: F.batch_norm(x, x[0].detach(), x[1].detach().abs(),
                                                                                  training=False))])
def test_ops_without_exact_ir_are_unknown(name, fn):
    """No IR op computes these exactly (erf, atan, 2^x, log2 need an irrational constant or a function the IR
    lacks; prod has no reduction op; eval-mode batch norm is not converted): UNKNOWN naming the op."""
    msg = unknown(lambda x: fn(x).sum(), dict(x=rnd(3, 5).abs() + 0.5), ("x",))
    assert name in msg


# ---------------------------------------------------------------- -inf
def test_masked_fill_neg_inf_softmax():
    x, R = rnd(3, 5), rnd(3, 5)
    m = torch.rand(3, 5, generator=g) > 0.5
    m[:, 0] = False
    check(lambda x, m, R: (x.masked_fill(m.bool(), float("-inf")).softmax(-1) * R).sum(),
          dict(x=x, m=m.long(), R=R), ("x",))
    _, nodes = ir_run(lambda x, m, R: (x.masked_fill(m.bool(), float("-inf")).softmax(-1) * R).sum(),
                      dict(x=x, m=m.long(), R=R), ("x",))
    # the -inf never reaches the IR: no infinite attribute, and the masked entries are zeroed after the softmax
    assert all(not (isinstance(v, float) and math.isinf(v)) for n in nodes for v in n.attrs.values())
    # masked entries' F replaced by the row's min before the softmax, zeroed after it
    assert [n.op for n in nodes if n.op in ("amin", "softmax", "where")][:4] == ["amin", "where", "softmax", "where"]


def _far_causal_qkv(L=5, E=8, step=800.0):
    """q, k, v whose causal scores grow by ``step`` per key: every masked score is above every kept one of its row
    (row 0's kept score is 0, its masked ones 800 ... 3200: exp(kept - row max) underflows to 0 in float64)."""
    u = torch.ones(E, dtype=D)
    q = u.expand(1, 1, L, E).clone()
    k = (torch.arange(L, dtype=D)[:, None] * u * step * math.sqrt(E) / E).expand(1, 1, L, E).clone()
    return dict(q=q, k=k, v=rnd(1, 1, L, E), R=rnd(1, 1, L, E))


def test_masked_softmax_far_below_masked_values_is_float64_exact():
    """H24: the kept scores ~1e3 below the masked F values (masked_fill of +1e4 entries, a causal SDPA whose masked
    scores are the row's largest): the float64 run gives PyTorch's numbers, not NaN (the masked F are replaced by
    the row's smallest F before the softmax's row max)."""
    x, R = rnd(3, 5) - 1e3, rnd(3, 5)
    m = torch.rand(3, 5, generator=g) > 0.5
    m[:, 0], m[0, 1:] = False, True
    x = torch.where(m, torch.full_like(x, 1e4), x)
    check(lambda x, m, R: (x.masked_fill(m.bool(), float("-inf")).softmax(-1) * R).sum(),
          dict(x=x, m=m.long(), R=R), ("x",))
    kw = _far_causal_qkv()
    (loss, dq, dk, dv), _ = ir_run(lambda q, k, v, R: (F.scaled_dot_product_attention(q, k, v, is_causal=True) * R)
                                   .sum(), kw, ("q", "k", "v"))
    assert all(np.isfinite(a).all() for a in (loss, dq, dk, dv))
    check(lambda q, k, v, R: (F.scaled_dot_product_attention(q, k, v, is_causal=True) * R).sum(), kw, ("q", "k", "v"))


def test_fully_masked_row_softmax_is_nan_like_pytorch():
    x = rnd(2, 3)
    m = torch.tensor([[1, 1, 1], [0, 1, 0]])
    (got,), _ = ir_run(lambda x, m: x.masked_fill(m.bool(), float("-inf")).softmax(-1).sum(1)[0], dict(x=x, m=m))
    want = torch_run(lambda x, m: x.masked_fill(m.bool(), float("-inf")).softmax(-1).sum(1)[0], dict(x=x, m=m))[0]
    assert np.isnan(want) and np.isnan(got)


def test_online_softmax_running_max_from_neg_inf():
    """A running max started at -inf (online softmax): maximum(-inf, y) = y, exp(-inf - m) = 0."""
    x, R = rnd(3, 6), rnd(3)

    def online(x, R):
        m = torch.full((3,), float("-inf"), dtype=D)
        l = torch.zeros(3, dtype=D)
        for blk in x.split(2, dim=1):
            m2 = torch.maximum(m, blk.amax(1))
            l = l * torch.exp(m - m2) + torch.exp(blk - m2[:, None]).sum(1)
            m = m2
        return ((m + torch.log(l)) * R).sum()

    check(online, dict(x=x, R=R), ("x",))


@pytest.mark.parametrize("case", ["sub_from", "times_tensor", "times_zero", "pos_inf", "nan", "output"])
def test_non_real_results_are_unknown(case):
    x, m = rnd(3, 4), (torch.rand(3, 4, generator=g) > 0.5).long()
    fns = {
        "sub_from": lambda x, m: (x - x.masked_fill(m.bool(), float("-inf"))).softmax(-1).sum(),  # +inf
        "times_tensor": lambda x, m: (x.masked_fill(m.bool(), float("-inf")) * x).softmax(-1).sum(),  # sign unknown
        "times_zero": lambda x, m: (x.masked_fill(m.bool(), float("-inf")) * 0).softmax(-1).sum(),  # NaN
        "pos_inf": lambda x, m: x.masked_fill(m.bool(), float("inf")).softmax(-1).sum(),
        "nan": lambda x, m: x.masked_fill(m.bool(), float("nan")).sum(),
        "output": lambda x, m: x.masked_fill(m.bool(), float("-inf")).amax(),
    }
    msg = unknown(fns[case], dict(x=x, m=m), ("x",))
    assert "inf" in msg or "NaN" in msg or "nan" in msg


def test_dropout_in_training_is_unknown():
    msg = unknown(lambda x: F.dropout(x, 0.1, training=True).sum(), dict(x=rnd(3, 4)), ("x",))
    assert "random" in msg


# ---------------------------------------------------------------- dtypes
def test_inputs_are_traced_in_the_dtype_the_code_uses():
    """A float64 spec traces float64 fake tensors (code that builds float64 constants computes in float64);
    every float dtype is the reals in the plan."""
    seen = []

    def logical(x, w):
        seen.append(x.dtype)
        return (x @ (w + torch.eye(4, dtype=torch.float64))).square().sum()

    def parallel(ctx, x, w):
        return logical(x, w)

    inp = {"x": {"shape": [2, 4], "dtype": "float64"}, "w": {"shape": [4, 4], "param": True, "dtype": "float64"}}
    raw = trace_plan(logical, parallel, inputs=inp, mesh={"tp": 2})
    assert set(seen) == {torch.float64}
    assert raw["logical"]["inputs"][0]["dtype"] == "float"
    assert verify(load_plan(raw)).verdict == "VERIFIED"


def test_dtensor_module_parameters_keep_their_dtype():
    import dtensor_ln_gelu_mlp as blk

    raw = blk.tvcert_trace(dtype="float64")
    assert verify(load_plan(raw)).verdict == "VERIFIED"


def test_bfloat16_inputs():
    import tp_ln_gelu_mlp as mlp

    raw = trace_plan(**mlp.tvcert_trace(dtype="bfloat16"))
    assert verify(load_plan(raw)).verdict == "VERIFIED"


def test_unknown_dtype_is_bad_input():
    with pytest.raises(TraceError) as ei:
        _parse_inputs({"x": {"shape": [2], "dtype": "complex64"}}, {})
    assert ei.value.kind == "input"


def test_an_uneven_shard_is_unknown_not_bad_input():
    """torch.chunk / DTensor's uneven Shard is legal PyTorch the plan cannot state yet: UNKNOWN (issue 15)."""
    from tvcert.frontends.trace import local_shape

    (spec,) = _parse_inputs({"w": {"shape": [30, 4], "placement": {"tp": "Shard(0)"}}}, {"tp": 4})
    with pytest.raises(TraceError) as ei:
        local_shape(spec, {"tp": 4})
    assert ei.value.kind == "unsupported" and "uneven" in str(ei.value)
    (spec,) = _parse_inputs({"w": {"shape": [32, 4], "placement": {"tp": "Shard(0)"}}}, {"tp": 4})
    assert local_shape(spec, {"tp": 4}) == [8, 4]


# ---------------------------------------------------------------- end to end
def _verdict(raw):
    return verify(load_plan(raw))


@pytest.mark.parametrize("kw,want", [
    ({}, "VERIFIED"),
    ({"approximate": "tanh", "dtype": "float64"}, "VERIFIED"),
    ({"tp": 4}, "VERIFIED"),
    ({"checkpoint": "nonreentrant"}, "VERIFIED"),
    ({"checkpoint": "reentrant"}, "VERIFIED"),
    ({"bug": "no_allreduce"}, "REFUTED"),
    ({"bug": "bias_every_rank"}, "REFUTED"),
    ({"bug": "no_input_grad_reduce"}, "REFUTED"),
    ({"bug": "no_allreduce", "checkpoint": "nonreentrant"}, "REFUTED"),
    ({"bug": "no_input_grad_reduce", "checkpoint": "reentrant"}, "REFUTED"),
])
def test_tp_layernorm_gelu_mlp(kw, want):
    import tp_ln_gelu_mlp as mlp

    res = _verdict(trace_plan(**mlp.tvcert_trace(**kw)))
    assert res.verdict == want, res.reasons
    if want == "REFUTED":
        assert res.counterexample and any(not o["equal"] for o in res.counterexample["outputs"])


@pytest.mark.parametrize("kw,want", [
    ({}, "VERIFIED"),
    ({"sp": True}, "VERIFIED"),
    ({"sp": True, "tp": 4}, "VERIFIED"),
    ({"sp": True, "bug": "no_sequence_parallel"}, "REFUTED"),
])
def test_dtensor_layernorm_gelu_mlp(kw, want):
    import dtensor_ln_gelu_mlp as blk

    res = _verdict(blk.tvcert_trace(**kw))
    assert res.verdict == want, res.reasons
    if kw.get("bug"):
        bad = {o["name"] for o in res.counterexample["outputs"] if not o["equal"]}
        assert bad == {"grad_norm__weight", "grad_norm__bias"}


@pytest.mark.parametrize("kw,want", [
    ({}, "VERIFIED"),
    ({"attn": "manual"}, "VERIFIED"),
    ({"bug": "no_allreduce"}, "REFUTED"),
    ({"bug": "not_causal"}, "REFUTED"),
    ({"attn": "manual", "bug": "not_causal"}, "REFUTED"),
    ({"bug": "local_scale"}, "REFUTED"),
])
def test_tp_attention_sdpa(kw, want):
    import tp_attention_sdpa as att

    res = _verdict(trace_plan(**att.tvcert_trace(**kw)))
    assert res.verdict == want, res.reasons


# ---------------------------------------------------------------- the check itself can fail
@pytest.mark.parametrize("op", ["aten.gelu_backward", "aten.cumsum", "aten.native_layer_norm"])
def test_the_per_op_check_catches_a_wrong_conversion(monkeypatch, op):
    """Positive control for the harness: a subtly wrong conversion (the gelu pdf term dropped, cumsum
    exclusive instead of inclusive, layer norm without eps) is caught against PyTorch."""
    from tvcert.frontends import aten as A

    right = A.TABLE[op]

    def wrong(c, n, *args, **kw):
        if op == "aten.gelu_backward":
            g_, x_ = args[:2]
            e = c.emit("gelu", [c.ir(x_)], {"approximate": "none"}, base=f"{n.name}_w")
            return c.emit("mul", [c.ir(g_), c.emit("sigmoid", [e], base=f"{n.name}_s")])
        if op == "aten.cumsum":
            out = right(c, n, *args, **kw)
            return c.emit("sub", [out, c.ir(args[0])])  # exclusive prefix sum
        return right(c, n, *args[:4], 0.0)  # eps dropped

    monkeypatch.setitem(A.TABLE, op, wrong)
    x, R = rnd(2, 3, 8) * 0.1, rnd(2, 3, 8)
    fns = {"aten.gelu_backward": lambda x, R: (F.gelu(x) * R).sum(),
           "aten.cumsum": lambda x, R: (x.cumsum(2) * R).sum(),
           "aten.native_layer_norm": lambda x, R: (F.layer_norm(x, (8,), eps=0.5) * R).sum()}
    with pytest.raises(AssertionError):
        check(fns[op], dict(x=x, R=R), ("x",))
    monkeypatch.setitem(A.TABLE, op, right)
    check(fns[op], dict(x=x, R=R), ("x",))


# ---------------------------------------------------------------- nll_loss / cross_entropy with ignore_index
def _ce_masked(reduction):
    def fn(x, t, pad):
        lab = torch.where(pad > 0, torch.full_like(t, -100), t)  # padding masked to ignore_index
        return F.cross_entropy(x, lab, reduction=reduction).sum()
    return fn


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_of_a_computed_target_drops_the_ignored_rows(reduction):
    """A target the program computes may equal ignore_index: torch drops those rows (a mean divides by the rows
    kept).  Converting it as a mean over every row made a per-rank mean of means with unequal padding VERIFIED."""
    ins = dict(x=rnd(6, 5), t=torch.randint(0, 5, (6,), generator=g), pad=torch.tensor([1, 0, 1, 0, 0, 0]))
    assert "ne" in check(_ce_masked(reduction), ins, ["x"])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_ignore_index_inside_the_classes(reduction):
    """ignore_index = 0 (a padding label that is also a class index): rows with target 0 are dropped."""
    def fn(x, t):
        return F.cross_entropy(x, t, reduction=reduction, ignore_index=0)

    ins = dict(x=rnd(6, 5), t=torch.tensor([0, 3, 0, 1, 4, 2]))
    assert "ne" in check(fn, ins, ["x"])


def test_cross_entropy_of_an_input_target_keeps_the_plain_form():
    """Targets read from an int input whose declared range [0, R) excludes the ignore_index: no mask is emitted.
    Without a declared range the mask is kept (the range inferred is [-100, C): tests/test_padded_labels.py)."""
    ins = dict(x=rnd(6, 5), t=torch.randint(0, 5, (2, 3), generator=g))
    assert "ne" not in check(lambda x, t: F.cross_entropy(x, t.flatten()), ins, ["x"])


def test_dp_mean_of_means_with_masked_padding_is_not_verified():
    import torch.distributed._functional_collectives as funcol

    def logical(x, t, pad):
        return F.cross_entropy(x, torch.where(pad > 0, torch.full_like(t, -100), t))

    def parallel(ctx, x, t, pad):  # each rank's mean over its own kept rows, averaged: wrong when counts differ
        return funcol.all_reduce(logical(x, t, pad), "avg", ctx.group("dp"))

    ins = {"x": {"shape": [8, 4], "placement": {"dp": "Shard(0)"}},
           "t": {"shape": [8], "dtype": "int", "range": 4, "placement": {"dp": "Shard(0)"}},
           "pad": {"shape": [8], "dtype": "int", "range": 2, "placement": {"dp": "Shard(0)"}}}
    res = verify(load_plan(trace_plan(logical, parallel, inputs=ins, mesh={"dp": 2})))
    assert res.verdict == "REFUTED"
