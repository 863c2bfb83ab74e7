"""The certificate checker: replays a certificate without the engine.

It trusts only the plan loader, the op definitions, and the rule kernel (``tvcert.kernel``),
the same way a HOL kernel trusts its few inference rules.  It re-derives every step from the
plan, re-generates and re-solves every SMT obligation, and checks every binding to the proof
manifest.  It never imports ``tvcert.engine`` (a test enforces that).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from ..deep import deep
from ..kernel.equality import Prover
from ..kernel.int_range import input_ranges
from ..kernel.expr import Exprs
from ..kernel.p2p import check_transfer, paired_send
from ..kernel.memo import TemplateFailure, boundary, canonical_key, derive_template, memoizable, replay, stages
from ..kernel.patterns import PATTERNS
from ..kernel.partial_read import RULE as PARTIAL_READ, read_as
from ..kernel.rules import RULES, Fact, RuleFailure, derive
from ..kernel.setup import input_facts, kctx, logical_exprs, output_targets, rank0_env
from ..kernel.sizes import second_instantiation, size_reasons
from ..kernel.smt import SOLVERS
from ..ops import REGISTRY, resolve_attrs
from ..plan import PlanError, load_plan, plan_digest
from .format import CERT_VERSION, SUPPORTED_VERSIONS, Certificate, manifest_path, parse_placements, stage_table


class Invalid(Exception):
    """The certificate does not prove what it claims; the message says the first failing check."""


class Unreadable(Exception):
    """The certificate or plan cannot be read at all (exit 3)."""


@dataclass
class CheckResult:
    steps: int
    obligations: int
    outputs: int
    solvers: list[str]
    size_check: str | None = None  # what stands behind a size-counting proof at other dims (kernel/sizes.py)


def read_certificate(path: str | Path) -> Certificate:
    """Read a certificate file as plans are read (:func:`tvcert.plan.read_json_file`: a regular file or ``-``, the
    size limit before and while reading, no NaN / overflowing numbers / lone surrogates); errors name the JSON path."""
    from ..plan import _short, parse_json_text, read_json_file

    try:
        raw = parse_json_text(read_json_file(path, "certificate"), "certificate")
    except PlanError as exc:
        raise Unreadable(f"{_short(path)}: {exc}") from None
    if not isinstance(raw, dict) or "tvcert_certificate" not in raw:
        raise Unreadable(f"{_short(path)}: $: not a tvcert certificate (no 'tvcert_certificate' field)")
    try:
        return Certificate.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{_short(p, 60)}" for p in e["loc"])
        raise Unreadable(f"{_short(path)}: {loc}: {_short(e['msg'].removeprefix('Value error, '), 300)}") from None
    except RecursionError:
        raise Unreadable(f"{_short(path)}: $: certificate nested too deeply") from None


@deep
def check_certificate(cert: Certificate, plan_path: str | Path | None = None, manifest: str | Path | None = None,
                      solvers: tuple[str, ...] = ("z3",), second: bool = False) -> CheckResult:
    """``second``: this is the certificate of a plan's second instantiation (it carries no further one)."""
    if cert.tvcert_certificate not in SUPPORTED_VERSIONS:
        raise Invalid(f"certificate version {cert.tvcert_certificate} is not supported (expected {CERT_VERSION}; "
                      f"supported {list(SUPPORTED_VERSIONS)})")
    # 1. the plan, bound by its hash
    raw = cert.plan.content
    if plan_path is not None:
        from ..plan import read_plan_json

        try:  # the plan reader's limits: regular file, size, depth, literals
            raw = read_plan_json(plan_path)
        except PlanError as exc:
            raise Unreadable(f"plan {plan_path}: {exc}") from None
    try:
        digest = plan_digest(raw)
    except (RecursionError, TypeError, ValueError) as exc:
        raise Unreadable(f"plan: $: cannot be hashed ({type(exc).__name__}: nested too deeply or not JSON data)") from None
    if digest != cert.plan.digest:
        raise Invalid(f"plan hash mismatch: the plan hashes to {digest}, the certificate was made for "
                      f"{cert.plan.digest} (the plan changed after certification)")
    try:
        plan = load_plan(raw)
    except PlanError as exc:
        raise Unreadable(f"plan: {exc}") from None
    if cert.plan.name != plan.name:
        raise Invalid(f"the certificate names plan {cert.plan.name!r}, the plan is {plan.name!r}")
    if [st.model_dump() for st in cert.stages] != stage_table(plan.raw):
        raise Invalid("the certificate's stage table does not match the plan's programs")
    # 2. the proof manifest, bound by its hash; every rule used has its proved theorem
    mpath = Path(manifest) if manifest else manifest_path()
    try:
        mbytes = mpath.read_bytes()
        mjson = json.loads(mbytes)
    except (OSError, json.JSONDecodeError) as exc:
        raise Unreadable(f"cannot read the proof manifest {mpath}: {exc}") from None
    mdigest = "sha256:" + hashlib.sha256(mbytes).hexdigest()
    if mdigest != cert.manifest.digest:
        raise Invalid(f"manifest digest mismatch: {mpath} hashes to {mdigest}, the certificate cites {cert.manifest.digest}")
    table = {**mjson.get("theorems", {}), **mjson.get("rules", {})}
    for rid, ref in cert.manifest.rules.items():
        if rid not in table or rid not in RULES:
            raise Invalid(f"rule {rid!r} is unknown: not in the proof manifest or not a kernel rule")
        if table[rid]["digest"] != ref.digest or table[rid]["theorem"] != ref.theorem:
            raise Invalid(f"rule {rid!r}: the certificate cites {ref.theorem} {ref.digest}, the manifest has "
                          f"{table[rid]['theorem']} {table[rid]['digest']}")
    # 3. replay every step
    exprs = Exprs()
    lexpr = logical_exprs(plan, exprs)
    facts = input_facts(plan, exprs, lexpr)
    done: dict[tuple[str, int], tuple[str, list[str]]] = {}  # replayed op -> (how: op / pattern / recv / instance, rules)
    templates: dict[str, object] = {}
    for k, st in enumerate(cert.steps):
        if st.instance_of is not None:
            _replay_instance(plan, exprs, facts, done, templates, k, st)
        else:
            _replay(plan, exprs, facts, done, k, st, cert.manifest.rules)
    # 4. outputs: placement and expression, with re-solved obligations
    recorded = {o.smt: o for o in cert.obligations}
    used_obl: set[str] = set()
    solve = _resolver(recorded, used_obl, solvers)
    prover = Prover(exprs, solve=solve, ranges=input_ranges(plan))
    targets = output_targets(plan, exprs, lexpr)
    names = [o.name for o in cert.outputs]
    if sorted(names) != sorted(plan.logical.outputs):
        raise Invalid(f"output matching covers {sorted(names)}, the plan's outputs are {sorted(plan.logical.outputs)}")
    for o in cert.outputs:
        b = plan.outputs[o.name]
        f = facts[b.program].get(b.local)
        if (o.program, o.local) != (b.program, b.local):
            raise Invalid(f"output {o.name!r}: certificate reads {o.program}.{o.local}, the plan says {b.program}.{b.local}")
        if f is None:
            raise Invalid(f"output {o.name!r}: local tensor {b.local!r} has no fact after replay (a step is missing)")
        if f.expr != o.expr or list(map(str, f.pl)) != o.placement:
            raise Invalid(f"output {o.name!r}: replay gives expression #{f.expr} as {list(map(str, f.pl))}, the "
                          f"certificate says #{o.expr} as {o.placement}")
        t = targets[o.name]
        e = read_as(exprs, plan.program_axes(b.program), plan.mesh(), f.expr, f.pl, t.pl)  # kernel/partial_read.py
        if e is None:
            raise Invalid(f"output {o.name!r}: placement {list(map(str, f.pl))} is not the declared {list(map(str, t.pl))}")
        if e != f.expr:
            prover.used.add(PARTIAL_READ)
        if not prover.equal(e, t.expr):
            raise Invalid(f"output {o.name!r}: expression #{f.expr} is not proved equal to the logical #{t.expr}"
                          + (f" ({'; '.join(prover.failures)})" if prover.failures else ""))
    for o in cert.obligations:
        if o.smt not in used_obl:
            raise Invalid(f"obligation {o.lhs} = {o.rhs} is not one the proof needs (tampered or stale)")
    for ob in prover.obligations:
        rec = recorded[ob.smt]
        if [tuple(x) for x in rec.reduction.witness] != [tuple(x) for x in ob.leaf_vars]:
            raise Invalid(f"obligation {ob.lhs} = {ob.rhs}: the reduction witness differs from the one the checker "
                          f"derives (leaves mapped to one variable must be proved equal: the map must be injective)")
        if (rec.lhs, rec.rhs) != (ob.lhs, ob.rhs):
            raise Invalid(f"obligation {rec.lhs} = {rec.rhs}: the checker derives it for {ob.lhs} = {ob.rhs}")
    used_rules = {r for st in cert.steps for r in st.rules} | prover.used
    if any(st.instance_of is not None for st in cert.steps):
        used_rules.add("stage_repeat")
    missing = used_rules - set(cert.manifest.rules)
    if missing:
        raise Invalid(f"rules {sorted(missing)} are used but not cited with their manifest digest")
    # 5. the expression table the certificate shows is the one replay built
    if [list(r) for r in exprs.export()] != [[i, op, at, list(args)] for i, op, at, args in cert.expressions]:
        raise Invalid("the certificate's expression table differs from the one replay builds")
    # 6. a proof that rests on sizes holds at the second instantiation of the dims too (kernel/sizes.py)
    sized = None if second else _check_sizes(cert, plan, used_rules, manifest, solvers)
    if second and cert.size_checks:
        raise Invalid("the certificate of a second instantiation carries size checks of its own")
    return CheckResult(len(cert.steps), len(prover.obligations), len(cert.outputs), list(solvers), sized)


def _check_sizes(cert, plan, used_rules, manifest, solvers) -> str | None:
    """The engine's second verification (engine/sizes.py), replayed: the checker picks the instantiation itself (the certificate
    cannot choose one where the sizes still coincide) and checks the certificate made there."""
    used = size_reasons(plan.raw, used_rules)
    if not used:
        if cert.size_checks:
            raise Invalid("the certificate carries size checks the proof does not need (tampered or stale)")
        return None
    alt = second_instantiation(plan.raw)
    if alt is None:
        if cert.size_checks:
            raise Invalid("the certificate carries size checks, but no second instantiation of the dims loads")
        return f"rests on sizes ({'; '.join(used)}); no second instantiation of the dims loads: proved at the declared dims only"
    dims, raw2, _ = alt
    want = plan_digest(raw2)
    got = [c for c in cert.size_checks if c.plan.digest == want]
    if len(cert.size_checks) != 1 or not got:
        raise Invalid(f"the proof rests on sizes ({'; '.join(used)}), so it must also hold at dims {dims}; the "
                      f"certificate carries no proof for the plan at those dims (a coincidence of sizes is no proof)")
    try:
        check_certificate(got[0], None, manifest, solvers, second=True)
    except Invalid as exc:
        raise Invalid(f"at the second instantiation of the dims {dims}: {exc}") from None
    except Unreadable as exc:
        raise Invalid(f"at the second instantiation of the dims {dims}: {exc}") from None
    return f"rests on sizes ({'; '.join(used)}); re-proved at dims {dims}"


def _replay(plan, exprs, facts, done, k, st, cited) -> None:
    where = f"step {k} ({st.program} node {st.node})"
    if st.program not in plan.programs or not 0 <= st.node < len(plan.programs[st.program].nodes):
        raise Invalid(f"{where}: no such node in the plan")
    if (st.program, st.node) in done:
        raise Invalid(f"{where}: the node is derived twice")
    n = plan.programs[st.program].nodes[st.node]
    if n.op != st.op:
        raise Invalid(f"{where}: the node is {n.op!r}, the certificate says {st.op!r}")
    for r in st.rules:
        if r not in cited:
            raise Invalid(f"{where}: rule {r!r} is not cited from the proof manifest (unknown rule id)")
    pf = facts[st.program]
    env = rank0_env(plan, st.program)
    ra = resolve_attrs(REGISTRY[n.op], n.attrs, env)
    try:
        out_pl = [parse_placements(p) for _, p in st.out]
    except ValueError as exc:
        raise Invalid(f"{where}: {exc}") from None
    if [[str(x) for x in pl] for pl in out_pl] != [list(p) for _, p in st.out]:
        raise Invalid(f"{where}: placements must be spelled canonically (Replicate, Shard(d), Partial(r))")
    if n.op == "recv":
        if st.rules != ["send_recv_preserves"] or st.peer is None:
            raise Invalid(f"{where}: a recv is justified only by send_recv_preserves with its peer send")
        want = _safe(where, lambda: paired_send(plan, st.program, st.node))  # the loader's pairing
        if tuple(st.peer) != want:
            raise Invalid(f"{where}: the certificate pairs this recv with {st.peer}, the plan pairs it with the send in "
                          f"{want[0]} node {want[1]}")
        sp, si = want
        _safe(where, lambda: check_transfer(plan, sp, st.program))
        sn = plan.programs[sp].nodes[si]
        f = facts[sp].get(sn.inputs[0])
        if f is None:
            raise Invalid(f"{where}: the sent tensor {sn.inputs[0]!r} has no fact yet (steps out of order)")
        got = [f]
        rules = ["send_recv_preserves"]
    elif st.pattern is not None:
        rule = next((r for r in st.rules if r in PATTERNS), None)
        if rule is None:
            raise Invalid(f"{where}: a matched pattern must cite a multi-op rule, got {st.rules}")
        try:
            d, nodes = PATTERNS[rule](plan.programs[st.program], st.node, pf, kctx(plan, st.program, exprs))
        except RuleFailure as exc:
            raise Invalid(f"{where}: {rule} does not match here: {exc}") from None
        if nodes != st.pattern:
            raise Invalid(f"{where}: {rule} matches ops {nodes}, the certificate says {st.pattern}")
        got, rules = d.facts, d.rules
    else:
        for x in n.inputs:
            if x not in pf:
                raise Invalid(f"{where}: premise {x!r} has no fact yet (a step is missing or out of order)")
        local_out = [s for s, _ in n.meta["shape@dims"]]
        try:
            d = derive(kctx(plan, st.program, exprs), n.op, ra, n.attrs, [pf[x] for x in n.inputs], local_out)
        except RuleFailure as exc:
            raise Invalid(f"{where}: rule {st.rules} does not apply: {exc}") from None
        got, rules = d.facts, d.rules
    if rules != st.rules:
        raise Invalid(f"{where}: the applicable rules are {rules}, the certificate says {st.rules}")
    claimed = [Fact(e, pl) for (e, _), pl in zip(st.out, out_pl)]
    if claimed != got:
        show = [(f.expr, list(map(str, f.pl))) for f in got]
        raise Invalid(f"{where}: {rules} conclude {show}, the certificate says {[(e, p) for e, p in st.out]}")
    for o, f in zip(n.outputs, got):
        pf[o] = f
    done[(st.program, st.node)] = ("recv" if n.op == "recv" else "pattern" if st.pattern is not None else "op", list(rules))


def _replay_instance(plan, exprs, facts, done, templates, k, st) -> None:
    """A memoized stage: same canonical form as an already replayed template stage.  The checker derives the
    template over slots itself (kernel.memo.derive_template: single-op rules only) and rebuilds the instance
    from it with its own boundary expressions at the slots (kernel.memo.replay, stage_repeat)."""
    where = f"step {k} (stage {st.program} [{st.node}, {st.stage_end}))"
    tp, ts = st.instance_of
    if st.program not in plan.programs or tp not in plan.programs:
        raise Invalid(f"{where}: no such program")
    g, gt = plan.programs[st.program], plan.programs[tp]
    spans = {s: e for s, e, _ in stages(g) if memoizable(g, s, e)}
    tspans = {s: e for s, e, _ in stages(gt) if memoizable(gt, s, e)}
    if spans.get(st.node) != st.stage_end:
        raise Invalid(f"{where}: not a memoizable stage of the plan")
    te = tspans.get(ts)
    if te is None:
        raise Invalid(f"{where}: the template [{tp} {ts}] is not a memoizable stage of the plan")
    how = [done.get((tp, i), (None, None))[0] for i in range(ts, te)]
    if any(h is None or h == "instance" for h in how):
        raise Invalid(f"{where}: the template stage has not been derived op by op before (steps missing or out of order)")
    if any(h != "op" for h in how):
        raise Invalid(f"{where}: the template stage [{tp} {ts}] is derived with a multi-op pattern or a recv; only a "
                      f"stage derived op by op by single-op rules can be a template")
    if any((st.program, i) in done for i in range(st.node, st.stage_end)):
        raise Invalid(f"{where}: ops of this stage are derived twice")
    key = canonical_key(plan, st.program, st.node, st.stage_end, facts[st.program], exprs)
    tkey = canonical_key(plan, tp, ts, te, facts[tp], exprs)
    if key is None:
        raise Invalid(f"{where}: an input of this stage has no fact yet (a step is missing or out of order)")
    if key != tkey or key != st.stage_key:
        raise Invalid(f"{where}: its canonical form {key} is not the template's {tkey} (recorded {st.stage_key})")
    t = templates.get(tkey)
    if t is None:
        try:
            t = derive_template(plan, tp, ts, te, facts[tp], exprs)
        except TemplateFailure as exc:
            raise Invalid(f"{where}: the template stage [{tp} {ts}] cannot be derived over slots: {exc}") from None
        if t.rules != [done[(tp, i)][1] for i in range(ts, te)]:
            raise Invalid(f"{where}: the template stage derived over slots applies other rules than its steps record")
        templates[tkey] = t
    try:
        replayed = replay(t, exprs, [facts[st.program][b].expr for b in boundary(g, st.node, st.stage_end)])
    except ValueError as exc:
        raise Invalid(f"{where}: {exc}") from None
    for j, fs in enumerate(replayed):
        n = g.nodes[st.node + j]
        for o, f in zip(n.outputs, fs):
            facts[st.program][o] = f
        done[(st.program, st.node + j)] = ("instance", list(t.rules[j]))


def _safe(where: str, fn):
    try:
        return fn()
    except RuleFailure as exc:
        raise Invalid(f"{where}: {exc}") from None


def _resolver(recorded, used: set[str], solvers: tuple[str, ...]) -> Callable[[str], str]:
    def solve(text: str) -> str:
        if text not in recorded:
            return "unknown"  # not claimed by the certificate: the equality it would serve stays unproved
        if recorded[text].answer != "unsat":
            raise Invalid(f"obligation recorded with answer {recorded[text].answer!r}, not unsat")
        for s in solvers:
            ans = SOLVERS[s](text)
            if ans != "unsat":
                raise Invalid(f"{s} answers {ans!r} on obligation {recorded[text].lhs} = {recorded[text].rhs}, not unsat")
        used.add(text)
        return "unsat"

    return solve
