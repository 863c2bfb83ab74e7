"""Symbolic dimension expressions.

A plan writes sizes and rank-dependent constants as small expressions over named dims
(``hidden``, ``seq/cp``) and mesh coordinates (``rank.tp``).  They are parsed once with
Python's ``ast`` module, restricted to integer arithmetic, and evaluated against a binding.
Keeping expressions symbolic is what lets one plan be checked at full size and run at tiny
sizes, and lets an SPMD program stay one program for every rank.
"""
from __future__ import annotations

import ast
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Union

MAX_DIM = 1 << 62  # absurd sizes are rejected, never allocated


class DimError(ValueError):
    """A dim expression is malformed or cannot be evaluated."""


_ALLOWED_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Div, ast.Mod)
_ALLOWED_CMP = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


@dataclass(frozen=True)
class DimExpr:
    """A parsed integer expression; ``text`` is its canonical spelling."""

    text: str
    tree: ast.AST

    def names(self) -> frozenset[str]:
        return _names(self.tree)

    def rank_axes(self) -> frozenset[str]:
        return frozenset(n[5:] for n in self.names() if n.startswith("rank."))

    def eval(self, env: Mapping[str, int]) -> int:
        return _eval(self.tree, env, self.text)

    def __str__(self) -> str:
        return self.text


Dim = Union[int, str]


MAX_EXPR_DEPTH = 100  # operators and operands nested in one dim expression


@lru_cache(maxsize=65536)
def parse(text: str) -> DimExpr:
    """Parse a dim expression such as ``hidden/tp`` or ``rank.tp*(vocab//tp)``."""
    if not isinstance(text, str) or not text.strip():
        raise DimError(f"empty dim expression {text!r}")
    if len(text) > 500:
        raise DimError("dim expression longer than 500 characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise DimError(f"cannot parse dim expression {text!r}: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise DimError(f"dim expression nested too deeply: {text[:60]!r}...") from None
    stack, depth = [(tree, 1)], 0  # bound the nesting before anything recurses over the tree
    while stack:
        node, d = stack.pop()
        depth = max(depth, d)
        if depth > MAX_EXPR_DEPTH:
            raise DimError(f"dim expression nested deeper than {MAX_EXPR_DEPTH} levels: {text[:60]!r}...")
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(node))
    _validate(tree, text)
    return DimExpr(ast.unparse(tree), tree)


def _validate(node: ast.AST, text: str) -> None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise DimError(f"{text!r}: only integer constants are allowed, got {node.value!r}")
        return
    if isinstance(node, ast.Name):
        return
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "rank":
            return
        raise DimError(f"{text!r}: only 'rank.<axis>' attributes are allowed")
    if isinstance(node, ast.BinOp) and isinstance(node.op, _ALLOWED_BINOPS):
        _validate(node.left, text)
        _validate(node.right, text)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        _validate(node.operand, text)
        return
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], _ALLOWED_CMP):
        _validate(node.left, text)
        _validate(node.comparators[0], text)
        return
    raise DimError(f"{text!r}: unsupported syntax {type(node).__name__}")


def _names(node: ast.AST) -> frozenset[str]:
    if isinstance(node, ast.Name):
        return frozenset([node.id])
    if isinstance(node, ast.Attribute):
        return frozenset([f"rank.{node.attr}"])
    out: frozenset[str] = frozenset()
    for child in ast.iter_child_nodes(node):
        out |= _names(child)
    return out


def _eval(node: ast.AST, env: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise DimError(f"{text!r}: unknown dim {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.Attribute):
        key = f"rank.{node.attr}"
        if key not in env:
            raise DimError(f"{text!r}: unknown mesh axis {node.attr!r} in rank coordinate")
        return env[key]
    if isinstance(node, ast.UnaryOp):
        return -_eval(node.operand, env, text)
    if isinstance(node, ast.Compare):
        a = _eval(node.left, env, text)
        b = _eval(node.comparators[0], env, text)
        op = node.ops[0]
        return int({ast.Eq: a == b, ast.NotEq: a != b, ast.Lt: a < b, ast.LtE: a <= b,
                    ast.Gt: a > b, ast.GtE: a >= b}[type(op)])
    assert isinstance(node, ast.BinOp)
    a = _eval(node.left, env, text)
    b = _eval(node.right, env, text)
    if isinstance(node.op, ast.Add):
        r = a + b
    elif isinstance(node.op, ast.Sub):
        r = a - b
    elif isinstance(node.op, ast.Mult):
        r = a * b
    else:
        if b == 0:
            raise DimError(f"{text!r}: division by zero")
        if isinstance(node.op, ast.Div):
            if a % b:
                raise DimError(f"{text!r}: {a} is not divisible by {b}")
            r = a // b
        elif isinstance(node.op, ast.FloorDiv):
            r = a // b
        else:
            r = a % b
    if abs(r) > MAX_DIM:
        raise DimError(f"{text!r}: value {r} is absurdly large")
    return r


class DimEnv(dict):
    """A dims binding that memoizes evaluated expressions (one graph pass evaluates the same few many times)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._memo: dict[str, int] = {}

    def value(self, text: str) -> int:
        got = self._memo.get(text)
        if got is None:
            got = parse(text).eval(self)
            self._memo[text] = got
        return got


def dim_value(d: Dim, env: Mapping[str, int]) -> int:
    """Evaluate an int or expression string."""
    if isinstance(d, bool):
        raise DimError(f"boolean {d!r} is not a dim")
    if isinstance(d, int):
        if abs(d) > MAX_DIM:
            raise DimError(f"value {d} is absurdly large")
        return d
    if isinstance(d, str):
        if isinstance(env, DimEnv):
            return env.value(d)
        return parse(d).eval(env)
    raise DimError(f"expected an integer or a dim expression, got {type(d).__name__}")


def dim_names(d: Dim) -> frozenset[str]:
    return parse(d).names() if isinstance(d, str) else frozenset()


_RANK_NAME = re.compile(r"rank\.([A-Za-z_][A-Za-z0-9_]*)")


def rank_axes_in(value: object) -> frozenset[str]:
    """Every mesh axis whose coordinate ``value`` mentions, at any nesting level (strings inside lists,
    lists inside lists, dict values).  Read off the text, not a parse, so a string that is not a valid
    dim expression still counts: deciding that an attribute is rank-free must never be fooled by where
    the rank is hidden."""
    found: set[str] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            found.update(_RANK_NAME.findall(v))
            # and as the evaluator reads it: ``rank . tp``, ``(rank).tp`` or a full-width ``ｒａｎｋ.tp`` (Python
            # normalises identifiers to NFKC) all evaluate to the tp coordinate
            found.update(_RANK_NAME.findall("".join(unicodedata.normalize("NFKC", v).split()).replace("(rank)", "rank")))
            try:
                found.update(parse(v).rank_axes())
            except (ValueError, TypeError):
                pass  # not a dim expression: never evaluated as one
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
    return frozenset(found)


def affine_in_rank(d: Dim, env: Mapping[str, int], axis: str) -> tuple[int, int] | None:
    """Return (base, stride) if ``d`` is ``base + stride*rank.axis`` for every rank, else None.

    Exact over the whole mesh: ``d`` may mention no other rank coordinate (``(rank.dp*tp + rank.tp)*B``
    is not affine in ``rank.tp`` with rank-free coefficients, whatever ``env`` holds for ``rank.dp``).
    Decided syntactically (rank appears only under +, -, and multiplication by rank-free
    terms), then the two coefficients are read off by evaluation at rank 0 and 1.
    """
    if isinstance(d, bool):
        return None
    if isinstance(d, int):
        return (d, 0)
    if not isinstance(d, str) or rank_axes_in(d) - {axis}:
        return None
    tree = parse(d).tree
    if not _is_affine(tree, f"rank.{axis}"):
        return None
    e0 = dict(env)
    e0[f"rank.{axis}"] = 0
    e1 = dict(env)
    e1[f"rank.{axis}"] = 1
    base = _eval(tree, e0, d)
    return base, _eval(tree, e1, d) - base


def _is_affine(node: ast.AST, var: str) -> bool:
    if var not in _names(node):
        return True
    if isinstance(node, ast.Attribute):
        return True
    if isinstance(node, ast.UnaryOp):
        return _is_affine(node.operand, var)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return _is_affine(node.left, var) and _is_affine(node.right, var)
        if isinstance(node.op, ast.Mult):
            left_has = var in _names(node.left)
            right_has = var in _names(node.right)
            if left_has and right_has:
                return False
            return _is_affine(node.left if left_has else node.right, var)
    return False
