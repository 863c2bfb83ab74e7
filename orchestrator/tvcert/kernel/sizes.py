"""Which second instantiation of a plan's dims a size-counting proof is re-checked at (engine and checker).

``reduction_normal_form`` and ``scale_common_factor`` turn sizes into numbers counted at the declared ``dims``,
so two counts can agree there only (a mean over d0 elements vs an average over d0 ranks).  A proof that used
one is therefore redone at a second instantiation, chosen here from the plan alone so that the engine
(``engine/sizes.py``) and the certificate checker pick the same one, and so that the plan's author does not
choose it (``run_dims`` could keep the coincidence: d0 = 8 on 4 x 2 ranks is the same accident as 4 on 2 x 2):

1. every non-mesh dim multiplied by its own prime (2, 3, 5, ... in name order): no linear or multiplicative
   relation between dims survives that the loader does not enforce;
2. else every non-mesh dim doubled, then tripled (dims tied by a reshape keep their ratios);
3. else the plan's ``run_dims`` when they differ from ``dims`` (the author's choice: weakest, last).

Mesh sizes stay: the plan is a plan for its mesh -- unless ``run_dims`` gives a mesh dim another size, since the
plan is then also run (and refuted) at that mesh: a literal 2.0 against an all_reduce(sum) of a replicated x is
right at tp = 2 and wrong at tp = 4, so a proof at the declared tp = 2 with run_dims tp = 4 was VERIFIED while
``tvcert run`` showed the two sides differ.  Every candidate then takes run_dims' mesh sizes (:func:`run_mesh`), its
non-mesh dims times the run mesh's rank count (so they still split there), and the primes of 1. are those no mesh
size (declared or run) has, so a relation between dims and the mesh breaks.
The first candidate that loads decides.

Counting rules are not the only way a size becomes a number: attributes are resolved at ``dims`` before
expressions are compared, so ``scale(x, "n")`` in the logical graph and ``scale(x, 4)`` in the program are the
same expression at n = 4 (and ``slice(.., end="n/2")`` the same as ``end="h-1"`` at n = 4, h = 3).  So the
second verification also runs when :func:`coincidences` finds an attribute whose value, computed from a
non-mesh dim, equals a literal or another such attribute written differently.
"""
from __future__ import annotations

import re

SIZE_COUNTING = ("reduction_normal_form", "scale_common_factor")
PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)


_ID = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _leaves(v):
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        else:
            yield x


def _attr_leaves(raw: dict):
    """Every scalar inside an attribute of every op (loop bodies included) and of every binding's layout."""
    def nodes(g):
        for n in (g.get("nodes") or []) if isinstance(g, dict) else []:
            if not isinstance(n, dict):
                continue
            yield n
            body = (n.get("attrs") or {}).get("body") if isinstance(n.get("attrs"), dict) else None
            if isinstance(body, dict):
                yield from nodes(body)

    for g in [raw.get("logical")] + list(raw.get("parallel") or []):
        for n in nodes(g):
            for k, v in (n.get("attrs") or {}).items():
                if k != "body":
                    yield from _leaves(v)
    for sect in ("inputs", "outputs"):
        for b in (raw.get(sect) or {}).values():
            for st in (b.get("layout") or []) if isinstance(b, dict) else []:
                if isinstance(st, dict):
                    yield from _leaves(st.get("attrs"))


def coincidences(raw: dict) -> list[tuple[int, list[str]]]:
    """(value, spellings) where an attribute computed from non-mesh dims equals, at ``dims``, a literal attribute
    or an attribute written differently (evaluated with every rank coordinate at 0 and at 1)."""
    from ..shapes import parse

    dims = raw.get("dims") or {}
    if not isinstance(dims, dict):
        return []
    fixed = mesh_dim_names(raw)
    free = {d for d in dims if d not in fixed}
    lits: set = set()
    derived: dict = {}
    for x in _attr_leaves(raw):
        if isinstance(x, bool):
            continue
        if isinstance(x, (int, float)):
            lits.add(x)
        elif isinstance(x, str) and set(_ID.findall(x)) & free:
            try:
                e = parse(x)
            except (ValueError, TypeError):
                continue
            if not e.names() & free:
                continue
            for r in (0, 1):
                try:
                    v = e.eval({**dims, **{n: r for n in e.names() if n.startswith("rank.")}})
                except (ValueError, TypeError, KeyError, ZeroDivisionError):
                    continue
                derived.setdefault(v, set()).add(e.text)
    return sorted((v, sorted(t)) for v, t in derived.items() if v in lits or len(t) > 1)


def size_reasons(raw: dict, used_rules) -> list[str]:
    """Why a proof of this plan must be redone at a second instantiation (empty: it need not).

    Every proof of a plan with non-mesh dims is: besides the counting rules, a side condition compares sizes
    computed at ``dims`` (a vocab block ``v/tp`` against an offset written ``rank.tp*4``, a rank count against an
    element count), and attributes are resolved there before expressions are compared; any literal or mesh
    size can agree with a dim's value at ``dims`` only.  The reasons name what was seen, for the message."""
    out = sorted(set(SIZE_COUNTING) & set(used_rules))
    mesh = run_mesh(raw)
    if mesh:
        out.append("run_dims size the mesh otherwise (" + ", ".join(f"{k} = {v}" for k, v in sorted(mesh.items()))
                   + "): the plan is run there, so it is proved there too")
    hits = coincidences(raw)
    if hits:
        out.append("attributes equal at the declared dims only: "
                   + ", ".join(f"{' = '.join(t)} = {v}" if len(t) > 1 else f"{t[0]} = {v} (a literal)" for v, t in hits[:3])
                   + (" ..." if len(hits) > 3 else ""))
    dims = raw.get("dims") if isinstance(raw.get("dims"), dict) else {}
    if not out and set(dims) - mesh_dim_names(raw):
        out.append("sizes enter the proof as numbers at the declared dims")
    return out


def mesh_dim_names(raw: dict) -> set[str]:
    mesh = raw.get("mesh") or []
    items = mesh.items() if isinstance(mesh, dict) else [tuple(m) for m in mesh if isinstance(m, (list, tuple))]
    names: set[str] = set()
    for entry in items:
        for part in entry:
            names |= set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", str(part)))
    return names


def run_mesh(raw: dict) -> dict:
    """The mesh dims ``run_dims`` gives another size than ``dims`` (name -> its run size)."""
    dims, run = raw.get("dims"), raw.get("run_dims")
    if not isinstance(dims, dict) or not isinstance(run, dict):
        return {}
    fixed = mesh_dim_names(raw)
    return {k: v for k, v in run.items() if k in fixed and k in dims and dims[k] != v}


def candidates(raw: dict) -> list[dict]:
    """Candidate dims for the second verification, in order of preference (see the module docstring)."""
    dims = raw.get("dims") or {}
    if not isinstance(dims, dict) or not dims:
        return []
    fixed = mesh_dim_names(raw)
    free = sorted(d for d, v in dims.items() if d not in fixed and isinstance(v, int))
    mesh = run_mesh(raw)
    primes, K = PRIMES, 1
    if mesh:  # at run_dims' mesh: dims times K = the run mesh's rank count (they split there) times a prime no mesh
        # size has (d0 = dp * tp = 4 at (2, 2) must not become 8 = 4 * 2 at (4, 2))
        run = {k: v for k, v in {**dims, **mesh}.items() if k in fixed and isinstance(v, int)}
        for v in run.values():
            K *= max(v, 1)
        sizes = [v for k, v in dims.items() if k in fixed and isinstance(v, int)] + list(run.values())
        primes = tuple(q for q in PRIMES if all(m % q for m in sizes if m))
    out = []
    if len(free) <= len(primes):
        out.append({**{d: (v * primes[free.index(d)] * K if d in free else v) for d, v in dims.items()}, **mesh})
    for k in (2, 3):
        out.append({**{d: (v * k * K if d in free else v) for d, v in dims.items()}, **mesh})
    run = raw.get("run_dims")
    if isinstance(run, dict) and run:
        out.append({**dims, **run})
    seen, uniq = [], []
    for alt in out:
        if alt != dims and alt not in seen:
            seen.append(alt)
            uniq.append(alt)
    return uniq


def second_instantiation(raw: dict, probe=None):
    """``(dims, raw, plan)`` of the first candidate that loads, or None (the claim is then at ``dims`` only).

    ``probe``: the plan already loaded from ``raw``.  A candidate whose shapes do not check there is skipped
    without a full load: the shape check is the only part of loading that depends on the dims, and loading
    runs the same check, so the candidate chosen is the same (a failed full load of a 405B plan took seconds)."""
    from ..plan import PlanError, check_shapes, load_plan

    for alt in candidates(raw):
        if probe is not None:
            try:
                check_shapes(probe, alt, "second-instantiation probe")
            except PlanError:
                continue
        # a top-level copy: nothing mutates a loaded plan's raw dict, and deep copies of a 405B plan took
        # most of the second verification's time
        other = {k: v for k, v in raw.items() if k != "run_dims"}
        other["dims"] = alt
        try:
            return alt, other, load_plan(other, check_run_dims=False)
        except PlanError:
            continue
    return None
