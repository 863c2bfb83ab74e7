"""Proof kernel tooling: build ``Rules/``, generate and check ``proofs/manifest.json``.

Standard library only.  The single source of truth for *which* theorem proves
*which* rule id is the pair of tables :data:`RULES` and :data:`THEOREMS` below;
the statements themselves always come from Coq (``Check @thm`` with a very large
printing width, whitespace normalised), never from this file.

What :func:`check` establishes, for a manifest:

1. ``Rules/`` builds with ``coq_makefile`` + ``make``;
2. no source file under ``Rules/`` contains ``Admitted``, ``admit``, ``Axiom``,
   ``Parameter``, ``Conjecture``, ``Unset Guard/Positivity/Universe Checking`` or
   ``bypass_check`` outside comments;
3. the manifest binds exactly the rule ids of :data:`RULES` and the theorem names of
   :data:`THEOREMS`; each entry's digest is the sha256 of its statement;
4. ``Check (@thm : statement)`` succeeds for every entry and the statement Coq
   prints for ``@thm`` is the pinned one (so the manifest in the repository is
   exactly what Coq proved);
5. ``Print Assumptions`` of every entry lists only axioms whose *fully qualified*
   name (resolved with ``Locate``, so that a user module that declares its own
   ``classic`` is not mistaken for the standard one) is in :data:`ALLOWED_AXIOMS`;
6. optionally ``coqchk`` re-checks every module (and the axioms it reports).

All theorem queries of one run go into a single generated ``.v`` file, so a check
takes seconds.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOGICAL_ROOT = "TVCert"
COQ_VERSION = "8.16.1"
COQ_WARNINGS = "-notation-overridden,-ambiguous-paths,-notation-incompatible-format"

#: Axioms a theorem may rest on (those of the standard Reals library); fully qualified
#: as ``Locate`` prints them with Coq 8.16.1 (note: ClassicalDedekindReals lives in
#: ``Coq.Reals``, not ``Coq.Logic``).
ALLOWED_AXIOMS = frozenset({
    "Coq.Reals.ClassicalDedekindReals.sig_forall_dec",
    "Coq.Reals.ClassicalDedekindReals.sig_not_dec",
    "Coq.Logic.FunctionalExtensionality.functional_extensionality_dep",
    "Coq.Logic.Classical_Prop.classic",
})

_T = LOGICAL_ROOT

#: rule id applied by the engine (exactly the keys of ``tvcert.kernel.rules.RULES``)
#: -> fully qualified Coq theorem.
RULES: dict[str, str] = {
    # memoized stages (kernel/memo.py)
    "stage_repeat": f"{_T}.Stage.stage_repeat",
    # multi-op patterns (kernel/patterns.py)
    "vocab_parallel_embedding": f"{_T}.Composite.vocab_parallel_embedding",
    # elementwise
    "ew_unary_shard": f"{_T}.Elementwise.ew_unary_shard",
    "ew_unary_replicate": f"{_T}.Elementwise.ew_unary_replicate",
    "ew_binary_shard": f"{_T}.Elementwise.ew_binary_shard",
    "ew_binary_replicate": f"{_T}.Elementwise.ew_binary_replicate",
    "ew_binary_shard_broadcast": f"{_T}.Elementwise.ew_binary_shard_broadcast",
    # linear ops on Partial(sum)
    "partial_scale": f"{_T}.Partial.partial_scale",
    "partial_div": f"{_T}.Partial.partial_div",
    "partial_neg": f"{_T}.Partial.partial_neg",
    "partial_add": f"{_T}.Partial.partial_add",
    "partial_sub": f"{_T}.Partial.partial_sub",
    "partial_linear_map": f"{_T}.Partial.partial_linear_map",
    "partial_plus_replicate_not_partial": f"{_T}.Partial.partial_plus_replicate_not_partial",
    "partial_avg_div_p_to_sum": f"{_T}.Partial.partial_avg_div_p_to_sum",
    # matmul / einsum
    "matmul_replicate": f"{_T}.Matmul.matmul_replicate",
    "matmul_col_parallel": f"{_T}.Matmul.matmul_col_parallel",
    "matmul_row_parallel": f"{_T}.Matmul.matmul_row_parallel",
    "matmul_batch_shard": f"{_T}.Matmul.matmul_batch_shard",
    "matmul_partial_lhs": f"{_T}.Matmul.matmul_partial_lhs",
    "matmul_partial_rhs": f"{_T}.Matmul.matmul_partial_rhs",
    "einsum_shard_free_index": f"{_T}.Matmul.einsum_shard_free_index",
    "einsum_shard_contracted_index": f"{_T}.Matmul.einsum_shard_contracted_index",
    "einsum_partial_operand": f"{_T}.Matmul.einsum_partial_operand",
    # collectives
    "allreduce_sum_partial": f"{_T}.Collectives.allreduce_sum_partial",
    "allreduce_avg_partial_avg": f"{_T}.Collectives.allreduce_avg_partial_avg",
    "allreduce_max_partial_max": f"{_T}.Collectives.allreduce_max_partial_max",
    "allreduce_avg_partial_sum": f"{_T}.Collectives.allreduce_avg_partial_sum",
    "allgather_shard": f"{_T}.Collectives.allgather_shard",
    "reduce_scatter_partial": f"{_T}.Collectives.reduce_scatter_partial",
    "reduce_scatter_avg_partial_sum": f"{_T}.FsdpCollectives.reduce_scatter_avg_partial_sum",
    "reduce_scatter_avg_nested": f"{_T}.FsdpNested.reduce_scatter_avg_nested",
    "all_to_all_reshard": f"{_T}.Collectives.all_to_all_reshard",
    "broadcast_replicate": f"{_T}.Collectives.broadcast_replicate",
    "send_recv_preserves": f"{_T}.Collectives.send_recv_preserves",
    "allreduce_nested_axes": f"{_T}.Collectives.allreduce_nested_axes",
    "allreduce_sum_replicate": f"{_T}.Collectives.allreduce_sum_replicate",
    "allreduce_avg_replicate": f"{_T}.Collectives.allreduce_avg_replicate",
    "allreduce_max_replicate": f"{_T}.Collectives.allreduce_max_replicate",
    # reductions and softmax
    "reduce_sum_sharded_dim": f"{_T}.Reductions.reduce_sum_sharded_dim",
    # reductions spelled differently, broadcasts read as shards (kernel/reductions.py, kernel/broadcast.py)
    "reduction_normal_form": f"{_T}.NormaliseReductions.reduction_normal_form",
    "replicate_broadcast_as_shard": f"{_T}.NormaliseReductions.replicate_broadcast_as_shard",
    "reduce_scatter_replicate": f"{_T}.CollectivesReal.reduce_scatter_replicate",
    "allreduce_avg_partial_sum_axes": f"{_T}.CollectivesReal.allreduce_avg_partial_sum_axes",
    "partial_sum_as_avg": f"{_T}.CollectivesReal.partial_sum_as_avg",
    "allgather_partial_sum": f"{_T}.CollectivesReal.allgather_partial_sum",
    "block_prefix_sum": f"{_T}.PrefixScan.block_prefix_sum",  # cumsum with a carried offset (kernel/prefix_scan.py)
    "block_prefix_sum_scanned": f"{_T}.PrefixScan.block_prefix_sum_scanned",
    "block_suffix_sum": f"{_T}.PrefixScan.block_suffix_sum",
    "block_suffix_sum_scattered": f"{_T}.PrefixScan.block_suffix_sum_scattered",  # autograd's backward of a scan
    "block_prefix_sum_scattered": f"{_T}.PrefixScan.block_prefix_sum_scattered",
    "scan_flip_pairs": f"{_T}.PrefixScan.scan_flip_pairs",
    # Megatron's target-logit pick of vocab-parallel cross-entropy and its backward (kernel/vocab_pick.py)
    "vocab_parallel_target_logit": f"{_T}.VocabPick.vocab_parallel_target_logit",
    "vocab_parallel_target_logit_backward": f"{_T}.VocabPick.vocab_parallel_target_logit_backward",
    "scan_last_row_total": f"{_T}.PrefixScan.scan_last_row_total",
    "allreduce_avg_partial_sum_nested": f"{_T}.CollectivesReal.allreduce_avg_partial_sum_nested",
    "reduce_mean_sharded_dim": f"{_T}.Reductions.reduce_mean_sharded_dim",
    "reduce_max_sharded_dim": f"{_T}.Reductions.reduce_max_sharded_dim",
    "reduce_other_dim": f"{_T}.Reductions.reduce_other_dim",
    "softmax_other_dim": f"{_T}.Reductions.softmax_other_dim",
    # layout
    "permute_shard": f"{_T}.Layout.permute_shard",
    "reshape_shard_block": f"{_T}.LayoutReal.reshape_shard_rowmajor",
    "slice_other_dim": f"{_T}.Layout.slice_other_dim",
    "slice_block_to_shard": f"{_T}.Layout.slice_block_to_shard",
    "concat_other_dim": f"{_T}.Layout.concat_other_dim",
    "pad_block_to_partial": f"{_T}.LayoutReal.pad_block_to_partial",
    "allgather_other_dim": f"{_T}.LayoutReal.allgather_other_dim",
    # fused tensors sharded per part (kernel/interleave.py)
    "split_interleaved_shard": f"{_T}.Interleave.split_interleaved_shard",
    "concat_interleaved_shard": f"{_T}.Interleave.concat_interleaved_shard",
    "interleave_commutes": f"{_T}.Interleave.interleave_commutes",
    # micro-batches of a data-parallel shard (kernel/microbatch.py)
    "slice_shard_microbatch": f"{_T}.Microbatch.slice_shard_microbatch",
    # the same with parts of different sizes, a GQA w_qkv (kernel/concat_groups.py)
    "split_grouped_shard": f"{_T}.ConcatGroups.split_grouped_shard",
    "concat_grouped_shard": f"{_T}.ConcatGroups.concat_grouped_shard",
    "concat_groups_commutes": f"{_T}.ConcatGroups.concat_groups_commutes",
    # a count of in-range labels is the token count (kernel/int_range.py)
    "int_range_count": f"{_T}.IntRange.int_range_fold",
    # ring attention (kernel/ring.py)
    "ring_attention_online_softmax": f"{_T}.Ring.ring_attention_online_softmax",
    "vocab_parallel_embedding_backward": f"{_T}.Composite.vocab_parallel_embedding_backward",
    "vocab_parallel_embedding_clamped": f"{_T}.Composite.vocab_parallel_embedding_clamped",
    "vocab_parallel_embedding_clamped_backward": f"{_T}.Composite.vocab_parallel_embedding_clamped_backward",
    "vocab_parallel_log_softmax": f"{_T}.LossParallel.vocab_parallel_log_softmax",
    "vocab_parallel_nll_loss": f"{_T}.LossParallel.vocab_parallel_nll_loss",
    "vocab_parallel_nll_backward": f"{_T}.LossParallel.vocab_parallel_nll_backward",
    "ring_attention_backward": f"{_T}.Ring.ring_attention_backward",
    # load-balanced (zig-zag) context parallelism (kernel/zigzag.py)
    "zigzag_ew_unary": f"{_T}.Zigzag.zigzag_ew_unary",
    "zigzag_ew_binary": f"{_T}.Zigzag.zigzag_ew_binary",
    "zigzag_ew_binary_broadcast": f"{_T}.Zigzag.zigzag_ew_binary_broadcast",
    "zigzag_rowwise": f"{_T}.Zigzag.zigzag_rowwise",
    "zigzag_rowwise2": f"{_T}.Zigzag.zigzag_rowwise2",
    "zigzag_reduce_sum": f"{_T}.Zigzag.zigzag_reduce_sum",
    "zigzag_reduce_max": f"{_T}.Zigzag.zigzag_reduce_max",
    "zigzag_reduce_mean": f"{_T}.Zigzag.zigzag_reduce_mean",
    "zigzag_contraction": f"{_T}.Zigzag.zigzag_contraction",
    "zigzag_from_slices": f"{_T}.Zigzag.zigzag_from_slices",
    "zigzag_from_index_block": f"{_T}.ZigzagIndex.zigzag_from_index_block",  # head-tail balancer's index
    "iota_rank_block": f"{_T}.IotaBlock.iota_rank_block",  # a rank's positions as arange(r*n, (r+1)*n)
    "zigzag_reshape": f"{_T}.Zigzag.zigzag_reshape",
    "zigzag_all_gather": f"{_T}.Zigzag.zigzag_all_gather_natural",
    "zigzag_reduce_scatter": f"{_T}.Zigzag.zigzag_reduce_scatter_order",
    "ring_attention_zigzag": f"{_T}.Zigzag.ring_attention_zigzag",
    # torch's unrolled ring: flash pairs merged in sigmoid form (kernel/ring_merge.py)
    "ring_sigmoid_merge": f"{_T}.RingMerge.ring_sigmoid_merge",
    "ring_sigmoid_merge_backward": f"{_T}.RingMerge.ring_sigmoid_merge_backward",
    # torch's causal ring: masked / skipped / partial chunks (kernel/ring_causal.py)
    "ring_masked_merge": f"{_T}.RingMasked.ring_masked_merge",
    "ring_masked_merge_backward": f"{_T}.RingMasked.ring_masked_merge_backward",
    # arbitrary ops, row-wise ops
    "replicate_any": f"{_T}.AnyOp.replicate_any",
    "rowwise_shard": f"{_T}.AnyOp.rowwise_shard",
    # equality steps (kernel/equality.py)
    "congruence": f"{_T}.AnyOp.congruence",
    "scale_commutes_linear": f"{_T}.EqSteps.scale_commutes_linear",
    "scale_common_factor": f"{_T}.Normalise2.scale_common_factor",
    "allreduce_mixed_axes": f"{_T}.Normalise2.allreduce_mixed_axes",
    "layout_commutes_pointwise": f"{_T}.EqSteps.layout_commutes_pointwise",
    "elementwise_smt": f"{_T}.EqSteps.elementwise_smt",
    "slice_concat_operand": f"{_T}.SliceConcat.slice_concat_operand",
    "scalar_factor_commutes": f"{_T}.ScalarFactor.scalar_factor_commutes",
    "layout_map_equal": f"{_T}.LayoutMap.layout_map_equal",
    "slice_reversed_block_to_shard": f"{_T}.ReversedBlocks.slice_reversed_block_to_shard",
    "reversed_blocks_commute": f"{_T}.ReversedBlocks.reversed_blocks_commute",
    "merge_interleaved_shard": f"{_T}.Interleave.concat_interleaved_shard",
    "split_interleaved_reshape": f"{_T}.Interleave.split_interleaved_shard",
}

#: theorems not tied to an engine rule.
THEOREMS: dict[str, str] = {
    "shape_reduction_corrected": f"{_T}.ShapeReduction.shape_reduction_corrected",
    "c12_ce_agree_at_0": f"{_T}.C12Counterexample.c12_ce_agree_at_0",
    "c12_ce_differ_at_1": f"{_T}.C12Counterexample.c12_ce_differ_at_1",
    "c12_ce_violates_H1": f"{_T}.C12Counterexample.c12_ce_violates_H1",
    "c12_ce_satisfies_H2": f"{_T}.C12Counterexample.c12_ce_satisfies_H2",
    "c12_original_false": f"{_T}.C12Counterexample.c12_original_false",
    "c12_without_H1_false": f"{_T}.C12Counterexample.c12_without_H1_false",
    "c12_without_H2_false": f"{_T}.C12Counterexample.c12_without_H2_false",
    "shard_nested_axes": f"{_T}.Collectives.shard_nested_axes",
    "stage_compose": f"{_T}.Stage.stage_compose",
    # proved, not applied by the engine (composite training rules, falsifier, variants)
    "partial_add_replicate_scaled": f"{_T}.Partial.partial_add_replicate_scaled",
    "partial_add_replicate_one_rank": f"{_T}.Partial.partial_add_replicate_one_rank",
    "reshape_transpose_swap_differs": f"{_T}.Layout.reshape_transpose_swap_differs",
    "reshape_split_merge_leading": f"{_T}.Layout.reshape_shard_block",
    "reshape_shard_nested": f"{_T}.LayoutReal.reshape_shard_nested",
    "reshape_shard_interleaved_differs": f"{_T}.LayoutReal.reshape_shard_interleaved_differs",
    "vocab_parallel_cross_entropy": f"{_T}.Composite.vocab_parallel_cross_entropy",
    "online_softmax_merge": f"{_T}.Composite.online_softmax_merge",
    "online_softmax_fold": f"{_T}.Ring.online_softmax_fold",
    "ring_pass_block": f"{_T}.Ring.ring_pass_block",
    "ring_travelling_sum": f"{_T}.Ring.ring_travelling_sum",
    "ring_local_sum": f"{_T}.Ring.ring_local_sum",
    "ring_fold_probabilities": f"{_T}.Ring.ring_fold_probabilities",
    "softmax_backward_rowsum": f"{_T}.Ring.softmax_backward_rowsum",
    "dp_mean_of_means": f"{_T}.Composite.dp_mean_of_means",
    "grad_accumulation": f"{_T}.Composite.grad_accumulation",
    "zero_sharded_adamw": f"{_T}.Composite.zero_sharded_adamw",
    "moe_dispatch_combine": f"{_T}.Composite.moe_dispatch_combine",
    "zigzag_index_bijection": f"{_T}.Zigzag.big_zigzag",
    "zigzag_const_row": f"{_T}.Zigzag.zigzag_const_row",
}

#: the algebraic flags of the ops (``linear_in`` / ``homogeneous_in`` of tvcert.ops, the ``linear_in`` of
#: the kernel's row-wise table, ``LINEAR_FIRST`` / ``MULTILINEAR`` of kernel/equality.py): every op the kernel
#: lets a Partial through, or moves a scalar across, is proved additive / homogeneous for that op in
#: Rules/OpFlags.v; the flags that were removed have their counterexample there.
OPFLAG_THEOREMS: dict[str, str] = {f"opflag_{n}": f"{_T}.OpFlags.{n}" for n in (
    "linear_op_partial", "linear_op_partial_avg", "masked_reindex_linear", "masked_reindex_homogeneous",
    "reindex_linear", "reindex_homogeneous", "reshape_op_linear", "permute_op_linear", "slice_op_linear",
    "flip_op_linear", "expand_op_linear", "tri_op_linear", "gather_linear", "pad_zero_linear",
    "pad_nonzero_not_additive", "where_zero_linear", "masked_fill_zero_linear", "masked_fill_nonzero_not_additive",
    "concat_linear", "neg_linear", "scale_linear", "mul_linear_l", "mul_linear_r", "div_linear_num",
    "cast_float_linear", "cast_float_homogeneous", "cast_int_not_additive", "sum_op_linear", "mean_op_linear",
    "embedding_backward_linear", "scatter_add_linear", "matmul_linear", "einsum_linear", "einsum_multi_homogeneous",
    "softmax_backward_linear", "log_softmax_backward_linear", "softmax_not_additive", "log_softmax_not_additive")}
THEOREMS.update(OPFLAG_THEOREMS)

#: op -> the OpFlags theorems about its flags (a test checks that every op with a linear / homogeneous flag,
#: for any attributes, is listed)
OPFLAGS: dict[str, tuple[str, ...]] = {
    "neg": ("neg_linear",), "scale": ("scale_linear",),
    "cast": ("cast_float_linear", "cast_float_homogeneous", "cast_int_not_additive"),
    "add": ("partial_add",), "sub": ("partial_sub",),
    "mul": ("mul_linear_l", "mul_linear_r"), "div": ("div_linear_num",),
    "masked_fill": ("masked_fill_zero_linear", "masked_fill_nonzero_not_additive"), "where": ("where_zero_linear",),
    **{op: ("reshape_op_linear",) for op in ("reshape", "view", "flatten", "squeeze", "unsqueeze")},
    "permute": ("permute_op_linear",), "transpose": ("permute_op_linear",),
    "slice": ("slice_op_linear",), "split": ("slice_op_linear",), "flip": ("flip_op_linear",),
    "expand": ("expand_op_linear",), "triu": ("tri_op_linear",), "tril": ("tri_op_linear",),
    "pad": ("pad_zero_linear", "pad_nonzero_not_additive"), "concat": ("concat_linear",),
    "gather": ("gather_linear",), "index_select": ("gather_linear",), "embedding": ("gather_linear",),
    "embedding_backward": ("embedding_backward_linear",),
    "scatter_add": ("scatter_add_linear",), "index_add": ("scatter_add_linear",),
    "sum": ("sum_op_linear",), "mean": ("mean_op_linear",),
    "matmul": ("matmul_linear",), "einsum": ("einsum_linear", "einsum_multi_homogeneous"),
    "softmax_backward": ("softmax_backward_linear",), "log_softmax_backward": ("log_softmax_backward_linear",),
    "softmax": ("softmax_not_additive",), "log_softmax": ("log_softmax_not_additive",),
}
#: the same, as fully qualified Coq theorems
OPFLAGS_QUALIFIED: dict[str, tuple[str, ...]] = {
    op: tuple(OPFLAG_THEOREMS.get(f"opflag_{n}") or RULES[n] for n in names) for op, names in OPFLAGS.items()}

FORBIDDEN = [
    (re.compile(r"\bAdmitted\b"), "Admitted"),
    (re.compile(r"\badmit\b"), "admit"),
    (re.compile(r"\bAxioms?\b"), "Axiom"),
    (re.compile(r"\bParameters?\b"), "Parameter"),
    (re.compile(r"\bConjectures?\b"), "Conjecture"),
    (re.compile(r"\bUnset\s+Guard\s+Checking\b"), "Unset Guard Checking"),
    (re.compile(r"\bUnset\s+Positivity\s+Checking\b"), "Unset Positivity Checking"),
    (re.compile(r"\bUnset\s+Universe\s+Checking\b"), "Unset Universe Checking"),
    (re.compile(r"\bbypass_check\b"), "bypass_check attribute"),
]

MARK = "@@TVCERT@@"


class ProofError(Exception):
    """A proof build or query failed; the message carries Coq's error text."""


@dataclasses.dataclass
class Entry:
    kind: str  # "rule" or "theorem"
    key: str
    theorem: str
    axioms: list[str] = dataclasses.field(default_factory=list)
    ok: bool = True


@dataclasses.dataclass
class CheckReport:
    ok: bool
    problems: list[str]
    entries: list[Entry]
    timings: dict[str, float]

    def format(self) -> str:
        lines = []
        if self.ok:
            lines.append(f"proof kernel OK: {len(self.entries)} theorems checked")
        else:
            lines.append(f"proof kernel check FAILED ({len(self.problems)} problem(s)):")
            lines += [f"  - {p}" for p in self.problems]
        lines.append("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        return "\n".join(lines)


# --------------------------------------------------------------------------- helpers

def _rules_dir(root: Path) -> Path:
    return Path(root) / "Rules"


def _modules(root: Path) -> list[str]:
    """Logical module names listed in Rules/_CoqProject, in build order."""
    proj = _rules_dir(root) / "_CoqProject"
    mods = []
    for line in proj.read_text().splitlines():
        line = line.strip()
        if line.endswith(".v") and not line.startswith("-"):
            mods.append(f"{LOGICAL_ROOT}." + line[:-2].replace("/", "."))
    return mods


def digest(statement: str) -> str:
    return "sha256:" + hashlib.sha256(statement.encode("utf-8")).hexdigest()


def normalize(statement: str) -> str:
    return " ".join(statement.split())


def _strip_comments(text: str) -> str:
    """Remove (nested) Coq comments and string literals."""
    out, depth, i, n = [], 0, 0, len(text)
    while i < n:
        if text.startswith("(*", i):
            depth += 1
            i += 2
        elif depth and text.startswith("*)", i):
            depth -= 1
            i += 2
        elif depth:
            out.append("\n" if text[i] == "\n" else "")
            i += 1
        elif text[i] == '"':
            j = text.find('"', i + 1)
            i = n if j < 0 else j + 1
            out.append('""')
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def forbidden_constructs(root: Path) -> list[str]:
    problems = []
    for f in sorted(_rules_dir(root).rglob("*.v")):
        text = _strip_comments(f.read_text(errors="replace"))
        for lineno, line in enumerate(text.splitlines(), 1):
            for rx, what in FORBIDDEN:
                if rx.search(line):
                    problems.append(f"{f.relative_to(root)}:{lineno}: forbidden construct '{what}'")
    return problems


def _run(cmd: list[str], cwd: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise ProofError(f"cannot run {cmd[0]}: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise ProofError(f"{' '.join(cmd)} timed out after {timeout}s") from e


def build(root: Path) -> None:
    """coq_makefile + make in Rules/; raises ProofError with Coq's error text.

    Serialized by a lock file: parallel test workers (pytest -n) build the same Rules/, and one's
    coq_makefile must not rewrite Makefile.coq under another's make."""
    rules = _rules_dir(root)
    if not (rules / "_CoqProject").exists():
        raise ProofError(f"{rules}/_CoqProject not found")
    with open(rules / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _build_locked(rules)


def _build_locked(rules: Path) -> None:
    p = _run(["coq_makefile", "-f", "_CoqProject", "-o", "Makefile.coq"], rules)
    if p.returncode != 0:
        raise ProofError("coq_makefile failed:\n" + p.stdout + p.stderr)
    jobs = str(max(1, min(8, os.cpu_count() or 1)))
    p = _run(["make", "-f", "Makefile.coq", "-j", jobs], rules)
    if p.returncode != 0:
        err = (p.stdout + p.stderr).strip().splitlines()
        raise ProofError("Coq build of Rules/ failed:\n" + "\n".join(err[-40:]))


def _preamble(root: Path) -> str:
    mods = " ".join(_modules(root))
    return (
        "From mathcomp Require Import all_ssreflect all_algebra.\n"
        f"Require Import {mods}.\n"
        "Import GRing.Theory Num.Theory.\n"
        "Open Scope ring_scope.\n"
        "Set Printing Width 1000000.\n"
    )


def _coqc_query(root: Path, body_lines: list[str]) -> tuple[int, str, int]:
    """Run coqc on preamble + body; returns (rc, output, number of preamble lines)."""
    pre = _preamble(root)
    text = pre + "\n".join(body_lines) + "\n"
    with tempfile.TemporaryDirectory(prefix="tvcert_q_") as td:
        q = Path(td) / "TVCertQuery.v"
        q.write_text(text)
        p = _run(["coqc", "-q", "-w", COQ_WARNINGS, "-Q", str(_rules_dir(root).resolve()),
                  LOGICAL_ROOT, str(q)], Path(td))
    return p.returncode, p.stdout + p.stderr, pre.count("\n")


def _split_marked(out: str) -> dict[str, str]:
    blocks: dict[str, list[str]] = {}
    cur = None
    for line in out.splitlines():
        if line.startswith(MARK + " "):
            cur = line[len(MARK) + 1:].strip()
            blocks[cur] = []
        elif cur is not None:
            blocks[cur].append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}


def _mark(key: str) -> str:
    return f'Goal True. idtac "{MARK} {key}". Abort.'


def _error_line(out: str) -> int | None:
    m = re.search(r'File "[^"]*TVCertQuery\.v", line (\d+)', out)
    return int(m.group(1)) if m else None


def printed_statements(root: Path, names: list[str]) -> dict[str, str]:
    """Statement of each fully qualified theorem as Coq prints it (``Check @thm``)."""
    body = []
    for nm in names:
        body += [_mark(nm), f"Check @{nm}."]
    rc, out, _ = _coqc_query(root, body)
    if rc != 0:
        raise ProofError("querying theorem statements failed:\n" + out.strip())
    blocks = _split_marked(out)
    res = {}
    for nm in names:
        b = blocks.get(nm, "")
        i = b.find("\n")
        rest = b[i + 1:] if i >= 0 else ""
        rest = rest.strip()
        if not rest.startswith(":"):
            raise ProofError(f"unexpected Check output for {nm}: {b!r}")
        res[nm] = normalize(rest[1:])
    return res


def _parse_assumptions(block: str) -> tuple[list[str], list[str]]:
    """(axiom names as printed, other unsafe lines) from Print Assumptions output."""
    names, unsafe = [], []
    lines = block.splitlines()
    section = None
    for line in lines:
        if not line.strip():
            continue
        if line.strip() == "Closed under the global context":
            continue
        if not line.startswith(" ") and line.rstrip().endswith(":") and " : " not in line:
            section = line.strip().rstrip(":")
            if section != "Axioms":
                unsafe.append(section)
            continue
        if line.startswith(" "):
            continue  # continuation of a type
        name = line.split(" : ", 1)[0].strip()
        if section == "Axioms":
            names.append(name)
        else:
            unsafe.append(f"{section}: {name}")
    return names, unsafe


def resolve_names(root: Path, names: list[str]) -> dict[str, str]:
    """Fully qualified name of each printed (shortest-suffix) name, via Locate."""
    if not names:
        return {}
    body = []
    for nm in names:
        body += [_mark(nm), f"Locate {nm}."]
    rc, out, _ = _coqc_query(root, body)
    if rc != 0:
        raise ProofError("Locate failed:\n" + out.strip())
    blocks = _split_marked(out)
    res = {}
    for nm in names:
        fq = None
        for line in blocks.get(nm, "").splitlines():
            m = re.match(r"\s*Constant\s+(\S+)", line)
            if m:
                fq = m.group(1)
                break
        res[nm] = fq or f"<unresolved {nm}>"
    return res


def generate_manifest(root: Path) -> dict:
    root = Path(root)
    build(root)
    names = list(RULES.values()) + list(THEOREMS.values())
    stm = printed_statements(root, names)

    def ent(thm: str) -> dict:
        return {"theorem": thm, "statement": stm[thm], "digest": digest(stm[thm])}

    return {
        "version": 1,
        "coq": COQ_VERSION,
        "logical_root": LOGICAL_ROOT,
        "rules": {k: ent(v) for k, v in sorted(RULES.items())},
        "theorems": {k: ent(v) for k, v in sorted(THEOREMS.items())},
    }


def dump_manifest(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_manifest(root: Path, path: Path | None = None) -> Path:
    root = Path(root)
    path = Path(path) if path else root / "proofs" / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_manifest(generate_manifest(root)))
    return path


_UNSAFE_STMT = re.compile(r'\.(\s|$)|\(\*|\*\)|"')


def check(root: Path, manifest_path: Path, coqchk: bool = False) -> CheckReport:
    root = Path(root)
    problems: list[str] = []
    timings: dict[str, float] = {}
    entries: list[Entry] = []

    def report() -> CheckReport:
        return CheckReport(ok=not problems, problems=problems, entries=entries, timings=timings)

    t = time.monotonic()
    try:
        build(root)
    except ProofError as e:
        problems.append(str(e))
        timings["build"] = time.monotonic() - t
        return report()
    timings["build"] = time.monotonic() - t

    problems += forbidden_constructs(root)

    try:
        manifest = json.loads(Path(manifest_path).read_text())
    except (OSError, ValueError) as e:
        problems.append(f"cannot read manifest {manifest_path}: {e}")
        return report()
    if manifest.get("logical_root") != LOGICAL_ROOT:
        problems.append(f"manifest logical_root is {manifest.get('logical_root')!r}, expected {LOGICAL_ROOT!r}")
    for kind, table in (("rules", RULES), ("theorems", THEOREMS)):
        got = set((manifest.get(kind) or {}).keys())
        for k in sorted(set(table) - got):
            problems.append(f"manifest {kind} lacks '{k}'")
        for k in sorted(got - set(table)):
            problems.append(f"manifest {kind} has unknown entry '{k}' (not in proofkit tables)")
        for k, v in sorted((manifest.get(kind) or {}).items()):
            if k in table and v.get("theorem") != table[k]:
                problems.append(f"{kind[:-1]} '{k}': manifest names {v.get('theorem')}, expected {table[k]}")
            entries.append(Entry(kind[:-1], k, str(v.get("theorem", ""))))

    # statement text sanity + digest
    checkable: list[tuple[Entry, str]] = []
    for e in entries:
        v = (manifest.get(e.kind + "s") or {})[e.key]
        st = v.get("statement", "")
        if not isinstance(st, str) or not st or _UNSAFE_STMT.search(st):
            problems.append(f"{e.kind} '{e.key}' ({e.theorem}): malformed statement in manifest")
            e.ok = False
            continue
        if v.get("digest") != digest(st):
            problems.append(f"{e.kind} '{e.key}' ({e.theorem}): digest does not match the statement")
            e.ok = False
        if not re.fullmatch(r"[A-Za-z0-9_'.]+", e.theorem):
            problems.append(f"{e.kind} '{e.key}': bad theorem name {e.theorem!r}")
            e.ok = False
            continue
        checkable.append((e, st))

    # batched Check (@thm : statement), Check @thm, Print Assumptions
    t = time.monotonic()
    pending = list(checkable)
    blocks: dict[str, str] = {}
    while pending:
        body: list[str] = []
        line_owner: dict[int, Entry] = {}
        pre_lines = _preamble(root).count("\n")
        for e, st in pending:
            body.append(_mark(e.key + "|" + e.kind))
            for cmd in (f"Check (@{e.theorem} : {st}).", f"Check @{e.theorem}.",
                        f"Print Assumptions {e.theorem}."):
                body.append(cmd)
                line_owner[pre_lines + len(body)] = e
        rc, out, _ = _coqc_query(root, body)
        if rc == 0:
            blocks.update(_split_marked(out))
            break
        ln = _error_line(out)
        bad = line_owner.get(ln) if ln else None
        if bad is None:
            problems.append("Coq query failed:\n" + out.strip()[-3000:])
            break
        msg = out[out.find("Error:"):].strip() if "Error:" in out else out.strip()
        problems.append(f"{bad.kind} '{bad.key}' ({bad.theorem}): statement not proved as pinned: "
                        + " ".join(msg.split())[:800])
        bad.ok = False
        pending = [(e, s) for e, s in pending if e is not bad]
    timings["query"] = time.monotonic() - t

    printed: dict[str, list[str]] = {}
    for e, st in pending:
        b = blocks.get(e.key + "|" + e.kind)
        if b is None:
            continue
        # the block holds, one per line (huge printing width): the ascription
        # "@thm : (stmt)" and its type, then "@thm" and its type, then the assumptions.
        segs = b.split("\n")
        stm_lines = [i for i, s in enumerate(segs) if re.match(r"\s+: ", s)]
        if len(stm_lines) < 2:
            problems.append(f"{e.kind} '{e.key}' ({e.theorem}): unexpected Coq output: {b[:300]!r}")
            e.ok = False
            continue
        coq_stm = normalize(segs[stm_lines[1]].strip()[1:])
        if coq_stm != normalize(st):
            problems.append(f"{e.kind} '{e.key}' ({e.theorem}): the statement Coq prints differs "
                            f"from the manifest (regenerate with `python -m tvcert.proofkit "
                            f"manifest --write`): Coq: {coq_stm[:300]}")
            e.ok = False
        ass = "\n".join(segs[stm_lines[1] + 1:])
        names, unsafe = _parse_assumptions(ass)
        for u in unsafe:
            problems.append(f"{e.kind} '{e.key}' ({e.theorem}): unsafe assumption: {u}")
            e.ok = False
        printed[e.key + "|" + e.kind] = names

    t = time.monotonic()
    try:
        fq = resolve_names(root, sorted({n for ns in printed.values() for n in ns}))
    except ProofError as ex:
        problems.append(str(ex))
        fq = {}
    timings["locate"] = time.monotonic() - t
    for e in entries:
        for n in printed.get(e.key + "|" + e.kind, []):
            q = fq.get(n, f"<unresolved {n}>")
            e.axioms.append(q)
            if q not in ALLOWED_AXIOMS:
                problems.append(f"{e.kind} '{e.key}' ({e.theorem}): relies on axiom {q} "
                                f"(printed as {n}), which is not allowed")
                e.ok = False

    if coqchk:
        t = time.monotonic()
        problems += run_coqchk(root)
        timings["coqchk"] = time.monotonic() - t
    return report()


def run_coqchk(root: Path) -> list[str]:
    rules = _rules_dir(root).resolve()
    if shutil.which("coqchk") is None:
        return ["coqchk not found"]
    p = _run(["coqchk", "-silent", "-o", "-Q", str(rules), LOGICAL_ROOT, *_modules(root)], rules)
    out = p.stdout + p.stderr
    probs = []
    if p.returncode != 0:
        probs.append("coqchk failed:\n" + "\n".join(out.strip().splitlines()[-30:]))
    # coqchk -o prints a context summary: "* Axioms:" followed by indented fully
    # qualified names, then "* Constants/Inductives relying on ...: <none>" lines.
    in_ax = False
    for line in out.splitlines():
        s = line.strip()
        if s.startswith("*"):
            in_ax = s.startswith("* Axioms")
            if "relying on" in s or "positivity is assumed" in s:
                if not s.endswith("<none>"):
                    probs.append(f"coqchk reports: {s}")
            continue
        if in_ax and s and s != "<none>":
            name = s.split()[0]
            if name not in ALLOWED_AXIOMS:
                probs.append(f"coqchk reports axiom {name}, which is not allowed")
    return probs


def table(root: Path, manifest_path: Path | None = None) -> str:
    root = Path(root)
    mp = Path(manifest_path) if manifest_path else root / "proofs" / "manifest.json"
    rep = check(root, mp)
    width = max(len(e.key) for e in rep.entries) if rep.entries else 10
    tw = max(len(e.theorem) for e in rep.entries) if rep.entries else 10
    lines = []
    for kind, head in (("rule", "rule id"), ("theorem", "theorem (no engine rule)")):
        if lines:
            lines.append("")
        lines.append(f"{head:<{width}}  {'Coq theorem':<{tw}}  assumptions")
        for e in rep.entries:
            if e.kind != kind:
                continue
            ax = ", ".join(a.rsplit(".", 1)[-1] for a in e.axioms) or "none (closed)"
            flag = "" if e.ok else "  [FAIL]"
            lines.append(f"{e.key:<{width}}  {e.theorem:<{tw}}  {ax}{flag}")
    if not rep.ok:
        lines.append("")
        lines.append(rep.format())
    return "\n".join(lines)


def _default_root() -> Path:
    return Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tvcert.proofkit",
                                 description="Build and check the Coq proof kernel (Rules/).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="build Rules/ and check proofs/manifest.json")
    c.add_argument("--coqchk", action="store_true", help="also re-check with coqchk")
    c.add_argument("--root", type=Path, default=None)
    c.add_argument("--manifest", type=Path, default=None)
    m = sub.add_parser("manifest", help="print (or --write) the manifest generated from Rules/")
    m.add_argument("--write", action="store_true")
    m.add_argument("--root", type=Path, default=None)
    tb = sub.add_parser("table", help="rule id / theorem / assumptions table")
    tb.add_argument("--root", type=Path, default=None)
    args = ap.parse_args(argv)
    root = (args.root or _default_root()).resolve()
    try:
        if args.cmd == "check":
            mp = args.manifest or root / "proofs" / "manifest.json"
            rep = check(root, mp, coqchk=args.coqchk)
            print(rep.format(), file=sys.stdout if rep.ok else sys.stderr)
            return 0 if rep.ok else 1
        if args.cmd == "manifest":
            if args.write:
                print(f"wrote {write_manifest(root)}")
            else:
                sys.stdout.write(dump_manifest(generate_manifest(root)))
            return 0
        if args.cmd == "table":
            out = table(root)
            print(out)
            return 0 if "FAILED" not in out else 1
    except ProofError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
