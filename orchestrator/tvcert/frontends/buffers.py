"""Buffers written in parts: ``torch.empty`` filled piece by piece, then read only where written.

Why: FSDP2's collectives run on flat buffers (``FSDPParamGroup``): ``all_gather_copy_in`` allocates the
all-gather output with ``torch.empty`` and writes this rank's shard into one slice of it, the all-gather then
overwrites all of it; the copy-out splits it into the unsharded parameters' fresh buffers; ``chunk_cat`` packs
the gradients into the reduce-scatter input; freeing a buffer (``storage.resize_(0)``) leaves it with no value.
:class:`Written` is such a value: an IR tensor that equals the buffer on the elements written so far, and the
boolean mask of those elements (numpy, exact per element).  Every view of it carries the view of its mask (the
same ATen op run on the mask), every write updates the mask, and a read is converted only when its mask is all
written; an element read before any write is refused (UNKNOWN), as for plain :class:`.aten.Uninit`.

Registered into :mod:`.aten`'s tables when it is imported (at the end of ``aten.py``):

* ``aten.as_strided`` of a contiguous tensor at storage offset 0 with contiguous strides: a window of its
  row-major elements (``reshape(slice(flatten(x)))``), refused otherwise;
* views, ``copy`` / ``copy_``, ``slice_scatter`` and ``as_strided_scatter`` of uninitialised or partly written
  memory; copying uninitialised memory gives uninitialised memory (FSDP2's free);
* FSDP2's own ops: ``fsdp.all_gather_copy_in`` (its CPU / CUDA kernel writes the inputs into the output's slice
  ``[numel * rank, numel * (rank + 1))`` and returns that slice and the output) and, as functionalization writes
  them (``auto_functionalized_v2``), ``fsdp.split_with_sizes_copy`` and ``fsdp.chunk_cat`` (dim 0, even chunks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from . import aten as A

aten = torch.ops.aten


@dataclass
class Written(A.Uninit):
    """Memory written in parts: ``value`` (an IR tensor) equals it where ``mask`` is True; elsewhere there is no
    value.  Never all written (that is ``value`` itself) and never nothing (that is :class:`.aten.Uninit`)."""

    value: str = ""
    mask: Any = None


def _norm(value: str, mask: np.ndarray, origin: str):
    if mask.all():
        return value
    if not mask.any():
        return A.Uninit(origin)
    return Written(origin, value, mask)


def _origin(v) -> str:
    return v.origin if isinstance(v, A.Uninit) else "?"


def _state(c, x):
    """(IR value, mask) of a tensor argument: initialised (all True), uninitialised (zeros, all False) or
    written in parts."""
    v = c.env.get(x) if isinstance(x, torch.fx.Node) else None
    shape = A._shape(c.val(x))
    if isinstance(v, Written):
        return v.value, v.mask
    if isinstance(v, A.Uninit):
        dt = A.ir_dtype(c.val(x))
        return c.const(0, shape, dt), np.zeros(shape, dtype=bool)
    return c.ir(x), np.ones(shape, dtype=bool)


def _mask_of(c, x) -> np.ndarray:
    v = c.env.get(x) if isinstance(x, torch.fx.Node) else None
    shape = A._shape(c.val(x))
    if isinstance(v, Written):
        return v.mask
    return np.zeros(shape, dtype=bool) if isinstance(v, A.Uninit) else np.ones(shape, dtype=bool)


def _with_value(c, n, x, value, handler, *a, **k):
    """Run the initialised-tensor conversion ``handler`` with ``x`` read as the IR tensor ``value``."""
    old = c.env[x]
    c.env[x] = value
    try:
        return handler(c, n, x, *a, **k)
    finally:
        c.env[x] = old


# -------------------------------------------------------------- as_strided of an initialised tensor
def _contiguous_strides(size) -> list[int]:
    out, acc = [], 1
    for s in reversed(size):
        out.append(acc)
        acc *= s
    return out[::-1]


def _window(c, n, x, size, stride, storage_offset):
    """(offset, numel) of an ``as_strided`` that reads a row-major window of ``x``; refuses anything else."""
    xv = c.val(x)
    size = [int(s) for s in size]
    off = int(storage_offset or 0)
    numel = math.prod(size)
    want = _contiguous_strides(size)
    if not isinstance(xv, torch.Tensor) or not xv.is_contiguous() or xv.storage_offset() != 0:
        c.fail("as_strided of a tensor that is not contiguous at storage offset 0 (its storage is not its "
               "row-major elements)")
    if any(int(s) != w for s, w, d in zip(stride, want, size) if d != 1) or len(stride) != len(size):
        c.fail(f"as_strided with strides {list(stride)} that are not the contiguous strides {want} of {size}")
    if off < 0 or off + numel > xv.numel():
        c.fail(f"as_strided window [{off}, {off + numel}) outside the {xv.numel()} elements of its input")
    return off, numel


@A.reg("aten.as_strided")
def _as_strided(c, n, x, size, stride, storage_offset=None):
    off, numel = _window(c, n, x, size, stride, storage_offset)
    size = [int(s) for s in size]
    xs = A._shape(c.val(x))
    y = c.ir(x)
    w = c.__dict__.get("written_windows", {}).get(y)
    if w is not None and w[:2] == (off, numel):  # the window just written (context_parallel()'s in-place buffer
        src, src_shape = w[2], w[3]  # sharding: resize_ + copy_): its elements are the written value's, row-major
        return src if src_shape == size else c.emit("reshape", [src], {"shape": size}, base=f"{n.name}_src")
    if xs == size and off == 0:
        return y
    if len(xs) != 1:
        y = c.emit("reshape", [y], {"shape": [math.prod(xs)]}, base=f"{n.name}_flat")
    if off != 0 or numel != math.prod(xs):
        y = c.emit("slice", [y], {"dim": 0, "start": off, "end": off + numel}, base=f"{n.name}_win")
    if size != [numel]:
        y = c.emit("reshape", [y], {"shape": size})
    return y


# -------------------------------------------------------------- views of partly written memory
_VIEW_HANDLERS = {"aten.view": "aten.view", "aten._unsafe_view": "aten._unsafe_view", "aten.reshape": "aten.reshape",
                  "aten.slice": "aten.slice", "aten.select": "aten.select", "aten.alias": "aten.alias",
                  "aten.detach": "aten.detach", "aten.as_strided": "aten.as_strided", "aten.narrow": "aten.narrow",
                  "aten.split": "aten.split", "aten.split_with_sizes": "aten.split_with_sizes",
                  "aten.unsqueeze": "aten.unsqueeze", "aten.squeeze": "aten.squeeze", "aten.t": "aten.t",
                  "aten.transpose": "aten.transpose", "aten.permute": "aten.permute", "aten.flatten": "aten.flatten",
                  "aten.unflatten": "aten.unflatten"}


def _table(name):
    return A.TABLE.get(name)


def _written_view(orig):
    def h(c, n, x, *a, **k):
        v = c.env.get(x) if isinstance(x, torch.fx.Node) else None
        if not isinstance(v, Written):
            return orig(c, n, x, *a, **k)
        if any(isinstance(c.env.get(y), A.Uninit) for y in A._flat(list(a) + list(k.values()))
               if isinstance(y, torch.fx.Node)):
            c.fail("an uninitialised tensor as a view op's second argument")
        pk = A._pk(n)
        handler = _table(str(n.target)) or _table(pk)
        if handler is None:
            c.fail(f"{pk} of partly written memory")
        if pk == "aten.as_strided":
            _window(c, n, x, *a, **k)
        # the view's mask: the same op on the mask (a contiguous tensor at storage offset 0, as checked for
        # as_strided), element for element
        m = n.target(torch.from_numpy(np.ascontiguousarray(v.mask)), *a, **k)
        outs = _with_value(c, n, x, v.value, handler, *a, **k)
        if isinstance(m, (list, tuple)):
            return [None if o is None else _norm(o, mi.numpy().copy(), v.origin) for o, mi in zip(outs, m)]
        return _norm(outs, m.contiguous().numpy().copy(), v.origin)
    return h


# -------------------------------------------------------------- writes
def _copy_any(orig):
    """``copy(dst, src)``: dst's values are not read.  From uninitialised or partly written memory the result
    is as uninitialised as the source (same shape only: a broadcast source is refused)."""
    def h(c, n, dst, src, *a, **k):
        sv = c.env.get(src) if isinstance(src, torch.fx.Node) else None
        if not isinstance(sv, A.Uninit):  # an initialised source (the conversions do not read dst's values)
            return orig(c, n, dst, src, *a, **k)
        if A._shape(c.val(src)) != A._shape(c.val(dst)) or A.ir_dtype(c.val(src)) != A.ir_dtype(c.val(dst)):
            c.fail(f"copies uninitialised memory ({sv.origin}) into a tensor of another shape or dtype")
        if str(n.target).startswith("aten.copy_"):
            A._check_unaliased(c, n, dst, "copy_")
            c.env[dst] = sv
        return sv
    return h


def _scatter_masks(c, n, base, src, write):
    """The result of writing ``src`` into ``base`` where ``write(base_array, src_array)`` puts it: its IR value
    (``write`` on the IR values through the initialised conversion) and its mask."""
    bval, bmask = _state(c, base)
    sval, smask = _state(c, src)
    mask = bmask.copy()
    write(mask, smask)
    return bval, sval, mask


def _slice_scatter_any(c, n, base, src, dim=0, start=None, end=None, step=1):
    shp = A._shape(c.val(base))
    d = int(dim) % len(shp)
    s, e = A._slice_range(shp[d], start, end)
    if int(step) != 1:
        c.fail("slice_scatter with step != 1")
    idx = tuple(slice(None) if i != d else slice(s, e) for i in range(len(shp)))

    def write(m, sm):
        m[idx] = sm

    bval, sval, mask = _scatter_masks(c, n, base, src, write)
    old_b, old_s = c.env.get(base), c.env.get(src) if isinstance(src, torch.fx.Node) else None
    c.env[base] = bval
    if isinstance(src, torch.fx.Node):
        c.env[src] = sval
    try:
        out = A._slice_scatter(c, n, base, src, dim, start, end, step)
    finally:
        c.env[base] = old_b
        if isinstance(src, torch.fx.Node):
            c.env[src] = old_s
    return _norm(out, mask, _origin(old_b) if isinstance(old_b, A.Uninit) else _origin(old_s))


def _write_window(c, base_val: str, base_shape, off: int, src_val: str, src_shape, tag: str) -> str:
    """IR: ``base`` (contiguous) with its row-major elements [off, off + numel(src)) replaced by ``src``."""
    N, k = math.prod(base_shape), math.prod(src_shape)
    if off == 0 and k == N:
        return src_val if list(src_shape) == list(base_shape) else \
            c.emit("reshape", [src_val], {"shape": list(base_shape)}, base=tag)
    flat = c.emit("reshape", [base_val], {"shape": [N]}, base=f"{tag}_flat") if len(base_shape) != 1 else base_val
    sflat = c.emit("reshape", [src_val], {"shape": [k]}, base=f"{tag}_src") if len(src_shape) != 1 else src_val
    parts = ([c.emit("slice", [flat], {"dim": 0, "start": 0, "end": off}, base=f"{tag}_lo")] if off > 0 else []) \
        + [sflat] + ([c.emit("slice", [flat], {"dim": 0, "start": off + k, "end": N}, base=f"{tag}_hi")]
                     if off + k < N else [])
    out = c.emit("concat", parts, {"dim": 0}, base=f"{tag}_cat")
    out = out if len(base_shape) == 1 else c.emit("reshape", [out], {"shape": list(base_shape)}, base=tag)
    c.__dict__.setdefault("written_windows", {})[out] = (off, k, src_val, list(src_shape))
    return out


def _write_view(c, n, base, view_size, view_stride, view_off, src_val: str, src_mask: np.ndarray, tag: str):
    """``base`` (fx node) after writing a value of mask ``src_mask`` into its view (size, stride, offset); the
    view must be a row-major window of ``base`` (contiguous at storage offset 0)."""
    off, numel = _window(c, n, base, view_size, view_stride, view_off)
    if list(src_mask.shape) != [int(s) for s in view_size]:
        c.fail(f"writes a value of shape {list(src_mask.shape)} into a view of shape {list(view_size)}")
    bval, bmask = _state(c, base)
    shape = A._shape(c.val(base))
    mask = bmask.copy().reshape(-1)
    mask[off:off + numel] = src_mask.reshape(-1)
    out = _write_window(c, bval, shape, off, src_val, list(view_size), tag)
    return _norm(out, mask.reshape(shape), _origin(c.env.get(base)))


def _as_strided_scatter_any(c, n, base, src, size, stride, storage_offset=None):
    sval, smask = _state(c, src)
    return _write_view(c, n, base, size, stride, storage_offset, sval, smask, n.name)


# -------------------------------------------------------------- FSDP2's ops
def _fresh_buffer(c, n, buf, what):
    """The buffer an FSDP op writes in place (its schema says it returns new tensors): nothing else may read it."""
    if not isinstance(buf, torch.fx.Node) or any(u is not n for u in buf.users):
        c.fail(f"{what} writes into its output buffer in place; the buffer is read elsewhere too")


def _flat_ir(c, x, tag):
    shp = A._shape(c.val(x))
    y = c.ir(x)
    return y if len(shp) == 1 else c.emit("reshape", [y], {"shape": [math.prod(shp)]}, base=tag)


def _unflattened(c, t) -> tuple[str, list[int]]:
    """(IR name, shape) of the tensor an all-gather input holds: ``X`` when the input is ``X.view(-1)`` (FSDP2's
    ``_sharded_param_data``, converted to ``reshape(X, [numel])``: the same elements, row-major), else itself."""
    import torch

    name, shp = c.ir(t), A._shape(c.val(t))
    pr = c.producer.get(name)
    if isinstance(t, torch.fx.Node) and t.args and isinstance(t.args[0], torch.fx.Node) and pr is not None and \
            pr.op == "reshape" and list(pr.attrs.get("shape", [])) == shp and len(shp) == 1 and \
            pr.inputs == [c.ir(t.args[0])] and isinstance(c.ir(t.args[0]), str):
        return pr.inputs[0], A._shape(c.val(t.args[0]))
    return name, shp


def _all_gather_copy_in(c, n, inputs, out, split_sizes, numel, rank):
    """Its kernel: ``out.narrow(0, numel * rank, numel)`` split by ``split_sizes`` receives the inputs (flattened),
    and both that slice and ``out`` are returned."""
    sizes = [int(s) for s in split_sizes]
    if sum(sizes) != int(numel) or len(sizes) != len(inputs) or \
            any(c.val(t).numel() != s for t, s in zip(inputs, sizes)):
        c.fail(f"all_gather_copy_in with split sizes {sizes} that are not its inputs' sizes summing to {numel}")
    if len(A._shape(c.val(out))) != 1:
        c.fail("all_gather_copy_in into a buffer that is not 1-D")
    _fresh_buffer(c, n, out, "all_gather_copy_in")
    flats = [_flat_ir(c, t, f"{n.name}_in{i}") for i, t in enumerate(inputs)]
    shard = flats[0] if len(flats) == 1 else c.emit("concat", flats, {"dim": 0}, base=f"{n.name}_shard")
    if len(flats) > 1:  # for unpack_flat_collectives: each piece's width and unflattened tensor
        c.nodes[-1].piece_widths = sizes
        c.nodes[-1].piece_sources = [_unflattened(c, t) for t in inputs]
    off = int(numel) * int(rank)
    if off + int(numel) > c.val(out).numel():
        c.fail("all_gather_copy_in writes past the end of its buffer")
    full = _write_view(c, n, out, [int(numel)], [1], off, shard, np.ones([int(numel)], dtype=bool), f"{n.name}_buf")
    return [shard, full]


def _auto_functionalized(c, n, op, **kw):
    """``auto_functionalized_v2(op, ..., _all_bases=[...], _<out>_base_index / _size / _stride /
    _storage_offset)``: the op's result and each base after the op's writes into its views.  Converted for
    FSDP2's ``split_with_sizes_copy`` and ``chunk_cat``."""
    name = str(op)
    bases = list(kw.get("_all_bases") or [])

    def view(prefix):
        return (int(kw[f"{prefix}_base_index"]), [int(s) for s in kw[f"{prefix}_size"]],
                [int(s) for s in kw[f"{prefix}_stride"]], int(kw.get(f"{prefix}_storage_offset") or 0))

    writes: list[tuple[int, Any, str]] = []  # (base index, view, IR value written)
    if name == "fsdp.split_with_sizes_copy.default":
        src, dim = kw["all_gather_output"], kw.get("dim", 0)
        sizes = [int(s) for s in kw["all_gather_input_split_sizes"]]
        k = int(kw["_out_length"])
        shp = A._shape(c.val(src))
        d = int(dim) % len(shp)
        if sum(sizes) != shp[d] or len(sizes) != k:
            c.fail(f"split_with_sizes_copy of {shp} by {sizes} along dim {d} into {k} outputs")
        start = 0
        for i, s in enumerate(sizes):
            piece = c.emit("slice", [c.ir(src)], {"dim": d, "start": start, "end": start + s},
                           base=f"{n.name}_piece{i}") if len(sizes) > 1 else c.ir(src)
            start += s
            bi, size, stride, off = view(f"_out_{i}")
            want = shp[:d] + [s] + shp[d + 1:]
            if size != want:
                c.fail(f"split_with_sizes_copy output {i} of shape {size}, its piece is {want}")
            writes.append((bi, (size, stride, off), piece))
    elif name == "fsdp.chunk_cat.default":
        ts, dim, chunks = list(kw["tensors"]), int(kw["dim"]), int(kw["num_chunks"])
        if dim != 0 or any(A._shape(c.val(t))[0] % chunks for t in ts):
            c.fail("chunk_cat other than along dim 0 with every tensor's dim 0 divisible by num_chunks (padding)")
        rows = []
        for i, t in enumerate(ts):
            r = c.emit("reshape", [c.ir(t)], {"shape": [chunks, c.val(t).numel() // chunks]}, base=f"{n.name}_ch{i}")
            rows.append(r)
        val = rows[0] if len(rows) == 1 else c.emit("concat", rows, {"dim": 1}, base=f"{n.name}_cat")
        if len(rows) > 1:  # for unpack_flat_collectives
            c.nodes[-1].piece_widths, c.nodes[-1].piece_rows = [c.val(t).numel() // chunks for t in ts], chunks
            c.nodes[-1].piece_sources = [(c.ir(t), A._shape(c.val(t))) for t in ts]
        bi, size, stride, off = view("_out")
        if size != [chunks, sum(c.val(t).numel() for t in ts) // chunks]:
            c.fail(f"chunk_cat into a view of shape {size}")
        writes.append((bi, (size, stride, off), val))
    else:
        c.fail(f"auto_functionalized {name}: only FSDP2's split_with_sizes_copy and chunk_cat are converted")
    new = {}
    for bi, (size, stride, off), val in writes:
        if bi in new:
            c.fail("two outputs written into one base")
        base = bases[bi]  # functional: the op's writes land in copies of the bases, returned after its result
        new[bi] = _write_view(c, n, base, size, stride, off, val, np.ones(size, dtype=bool), f"{n.name}_b{bi}")
    return [None] + [new.get(i, c.env.get(b)) for i, b in enumerate(bases)]


def _auto_functionalized_h(c, n, op, *a, **kw):
    if a:
        c.fail("auto_functionalized with positional arguments")
    return _auto_functionalized(c, n, op, **kw)


def _fresh_uninit(c, n, x, *a, **k):
    """``empty_like(x)`` / ``x.new_empty(...)``: new memory, uninitialised whatever ``x`` holds."""
    return A.Uninit(f"{A._pk(n)} at {c.cur_src}" if c.cur_src else A._pk(n))


def _register() -> None:
    for name in ("aten.empty_like", "aten.new_empty", "aten.new_empty_strided"):
        A.UNINIT_TABLE[name] = _fresh_uninit
    for name in list(A.UNINIT_TABLE):
        pk = name
        if pk in _VIEW_HANDLERS:
            A.UNINIT_TABLE[name] = _written_view(A.UNINIT_TABLE[name])
    for name in ("aten.copy", "aten.copy_"):
        A.UNINIT_TABLE[name] = _copy_any(A.UNINIT_TABLE[name])
    A.UNINIT_TABLE["aten.slice_scatter"] = _slice_scatter_any
    A.UNINIT_TABLE["aten.as_strided_scatter"] = _as_strided_scatter_any
    A.TABLE["aten.as_strided_scatter"] = _as_strided_scatter_any
    for table in (A.TABLE, A.UNINIT_TABLE):
        table["fsdp.all_gather_copy_in"] = _all_gather_copy_in
        table["auto_functionalized_v2"] = _auto_functionalized_h


_register()


# -------------------------------------------------------------- flat collectives, one per tensor
def unpack_flat_collectives(nodes: list, outputs: list, axis_size) -> list:
    """FSDP2 all-gathers (reduce-scatters) all of a group's parameters (gradients) as one flat buffer; each
    tensor's slice of the result is that collective of the tensor alone, exactly, for any values:

    * ``slice(reshape(all_gather(concat(flatten(X_1)..flatten(X_k)), dim 0), [p, N]), dim 1, o_i, o_i + n_i)``
      (``X_j`` of ``n_j`` elements, ``o_i = n_1 + .. + n_(i-1)``, ``N`` their sum, ``p`` the axis size): row r is
      rank r's ``flatten(X_i)``, which is ``reshape(all_gather(X_i, dim 0), [p, n_i])`` (row-major order);
    * ``slice(reduce_scatter(reshape(concat(q_1..q_k, dim 1), [p * N]), dim 0), dim 0, o_i, o_i + n_i)`` with
      ``q_j = reshape(G_j, [p, n_j])`` (``chunk_cat``; ``G_j``'s dim 0 divisible by ``p``): rank r's elements are
      the reduction over the ranks of row r of their ``q_i``, i.e. of ``G_i``'s rows [r a, (r + 1) a) flattened,
      which is ``reshape(reduce_scatter(G_i, dim 0), [n_i])`` (an elementwise reduction: sum, avg, max);
      all_reduces between the reduce-scatter and the slice (HSDP's, over the replicate axis) are elementwise
      over the ranks too, and move with it.

    The concats are the ones FSDP2's conversions emitted, which record each piece's width and unflattened
    tensor (``piece_widths``, ``piece_sources``; ``piece_rows`` = p for ``chunk_cat``); each matching slice is
    replaced by the per-tensor collective under its own name, anything else is kept (and the flat collective
    with it while something reads it)."""
    prod = {o: nd for nd in nodes for o in nd.outputs}
    used = {o for nd in nodes for o in nd.outputs} | {i for nd in nodes for i in nd.inputs}

    def fresh(base):
        k, name = 0, base
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        return name

    def piece(cat, lo, hi):
        """(unflattened source name, its shape, width) of the piece [lo, hi), else None."""
        off = 0
        for (name, shape), w in zip(cat.piece_sources, cat.piece_widths):
            if (lo, hi) == (off, off + w):
                return name, list(shape), w
            off += w
        return None

    def packed(nd, dim):
        return nd is not None and nd.op == "concat" and nd.attrs.get("dim") == dim and \
            len(getattr(nd, "piece_widths", ())) == len(nd.inputs) == len(getattr(nd, "piece_sources", ()))

    known: dict[str, list[int]] = {}  # each per-tensor collective's result -> its shape
    out = []
    for nd in nodes:
        rep = None
        src = prod.get(nd.inputs[0]) if nd.op == "slice" and nd.inputs and nd.attrs.get("step", 1) == 1 else None
        if src is not None and nd.attrs.get("dim") == 1 and src.op == "reshape":  # the all-gather's copy-out
            g = prod.get(src.inputs[0])
            cat = prod.get(g.inputs[0]) if g is not None and g.op == "all_gather" and g.attrs.get("dim") == 0 else None
            if packed(cat, 0):
                p, N = axis_size(g.attrs["axis"]), sum(cat.piece_widths)
                hit = piece(cat, nd.attrs["start"], nd.attrs["end"]) if list(src.attrs.get("shape", [])) == [p, N] \
                    else None
                if hit is not None and hit[1]:  # all_gather(flatten(X)) = flatten(all_gather(X, dim 0)), row-major
                    x, shape, w = hit
                    t = fresh(f"{nd.outputs[0]}_ag")
                    rep = [A.IRNode("all_gather", [x], [t], {"axis": g.attrs["axis"], "dim": 0}, g.src),
                           A.IRNode("reshape", [t], list(nd.outputs), {"shape": [p, w]}, nd.src)]
                    known[t] = [p * shape[0], *shape[1:]]
        ars = []  # HSDP: all_reduces over the replicate axis after the reduce-scatter (elementwise: a slice commutes)
        while src is not None and src.op == "all_reduce" and nd.attrs.get("dim") == 0:
            ars.append(src)
            src = prod.get(src.inputs[0])
        if src is not None and nd.attrs.get("dim") == 0 and src.op == "reduce_scatter" and src.attrs.get("dim") == 0:
            flat = prod.get(src.inputs[0])
            cat = prod.get(flat.inputs[0]) if flat is not None and flat.op == "reshape" else None
            if packed(cat, 1):
                p, N = axis_size(src.attrs["axis"]), sum(cat.piece_widths)
                hit = piece(cat, nd.attrs["start"], nd.attrs["end"]) \
                    if getattr(cat, "piece_rows", None) == p and list(flat.attrs.get("shape", [])) == [p * N] else None
                if hit is not None and hit[1] and hit[1][0] % p == 0:
                    # rank r's row of reshape(G, [p, -1]) is G's rows [r*a, (r+1)*a) flattened (a = G.shape[0] / p):
                    # reduce_scatter(flatten(row-chunks of G)) = flatten(reduce_scatter(G, dim 0))
                    x, shape, w = hit
                    chain = [src, *reversed(ars)]
                    names = [fresh(f"{nd.outputs[0]}_rs{j}") for j in range(len(chain))]
                    rep = [A.IRNode(c_nd.op, [x if j == 0 else names[j - 1]], [o],
                                    {**c_nd.attrs, "dim": 0} if j == 0 else dict(c_nd.attrs), c_nd.src)
                           for j, (c_nd, o) in enumerate(zip(chain, names))]
                    rep.append(A.IRNode("reshape", [names[-1]], list(nd.outputs), {"shape": [w]}, nd.src))
                    known[names[-1]] = [shape[0] // p, *shape[1:]]
        out.extend(rep if rep is not None else [nd])
    return A.dce(_reshape_back(out, known), outputs)


def _reshape_back(nodes: list, known: Mapping[str, list[int]]) -> list:
    """A chain of reshapes from a per-tensor collective's result back to that result's own shape (FSDP2 views
    the flat piece as the parameter or its gradient) is one reshape of the result to its shape: a composition
    of row-major reshapes is the row-major reshape to the last shape, exactly.  Without this, a piece whose
    tensor is sharded on a dim after the first (TP's ``Shard(1)`` under FSDP2) would pass through a flatten
    no layout rule splits into shards."""
    prod = {o: nd for nd in nodes for o in nd.outputs}
    out = []
    for nd in nodes:
        if nd.op == "reshape" and len(nd.inputs) == 1:
            y = nd.inputs[0]
            while y not in known and y in prod and prod[y].op == "reshape" and len(prod[y].inputs) == 1:
                y = prod[y].inputs[0]
            if y in known and y != nd.inputs[0] and list(nd.attrs.get("shape", [])) == known[y]:
                nd = A.IRNode("reshape", [y], list(nd.outputs), dict(nd.attrs), nd.src)
        out.append(nd)
    return out
