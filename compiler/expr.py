"""Parsing of the two kinds of text a spec holds: op statements and dimension expressions.

Both are parsed with Python's `ast` and interpreted over a closed vocabulary; nothing in a spec
is ever executed as Python.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ExprError(ValueError):
    """A statement or expression outside the spec language."""


# ---- op statements --------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A named thing: a value (`x`), a dimension (`eps`) or a layer-kind field (`kind.theta`)."""

    name: str


@dataclass(frozen=True)
class Call:
    op: str
    args: tuple[Any, ...]  # Ref | Call | literal
    kwargs: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Add:
    left: Any
    right: Any


@dataclass(frozen=True)
class Statement:
    targets: tuple[str, ...]
    values: tuple[Any, ...]  # one expression per target, or one Call yielding all targets


def parse_statement(text: str) -> Statement:
    """`q, k = rope(q, k, ...)` or `x = x + linear(a, 'w')` or `q, k = f(q), g(k)`."""
    try:
        tree = ast.parse(text.strip(), mode="exec")
    except SyntaxError as e:
        raise ExprError(f"not a statement: {text!r} ({e.msg})") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
        raise ExprError(f"expected one assignment `name = op(...)`, got {text!r}")
    node = tree.body[0]
    if len(node.targets) != 1:
        raise ExprError(f"chained assignment is not allowed: {text!r}")
    target = node.targets[0]
    names = _target_names(target, text)
    if isinstance(node.value, ast.Tuple):
        values = tuple(_expr(v, text) for v in node.value.elts)
        if len(values) != len(names):
            raise ExprError(f"{len(names)} targets but {len(values)} values in {text!r}")
    else:
        values = (_expr(node.value, text),)
    return Statement(names, values)


def _target_names(target: ast.expr, text: str) -> tuple[str, ...]:
    if isinstance(target, ast.Name):
        return (target.id,)
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return tuple(e.id for e in target.elts)
    raise ExprError(f"assignment targets must be names: {text!r}")


def _expr(node: ast.expr, text: str) -> Any:
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            raise ExprError(f"only plain op names can be called: {text!r}")
        args = tuple(_expr(a, text) for a in node.args)
        kwargs = tuple((k.arg, _expr(k.value, text)) for k in node.keywords if k.arg is not None)
        if len(kwargs) != len(node.keywords):
            raise ExprError(f"**kwargs are not allowed: {text!r}")
        return Call(node.func.id, args, kwargs)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return Add(_expr(node.left, text), _expr(node.right, text))
    if isinstance(node, ast.Name):
        if node.id in ("true", "false", "True", "False"):  # TOML-style booleans read naturally in specs
            return node.id in ("true", "True")
        return Ref(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "kind":
        return Ref(f"kind.{node.attr}")
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        return node.value
    raise ExprError(f"unsupported expression {ast.unparse(node)!r} in {text!r}")


# ---- dimension expressions --------------------------------------------------------------------

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def expression_names(text: str) -> set[str]:
    """The dimension names an arithmetic expression reads."""
    tree = _parse_arith(text)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def evaluate(text: str, env: Mapping[str, Any]) -> Any:
    """Evaluate `d // hq`, `dh ** -0.5`, ... over already-resolved dimensions."""
    return _eval(_parse_arith(text).body, env, text)


def _parse_arith(text: str) -> ast.Expression:
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"not an expression: {text!r} ({e.msg})") from None


def _eval(node: ast.expr, env: Mapping[str, Any], text: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExprError(f"unknown dimension {node.id!r} in {text!r}")
        return env[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env, text)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval(node.left, env, text), _eval(node.right, env, text))
    raise ExprError(f"unsupported arithmetic in {text!r}")
