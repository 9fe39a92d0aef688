"""Rewards for the calculator demo, in TRL's signature f(prompts, completions, **columns) -> list[float].

``right_call``: 1.0 when the completion calls the calculator with an expression whose value is the
row's ``answer`` ("37 * 12", "37*12" and "12 * 37" all count) -- the model understood the question,
not only the format. Expressions are evaluated by walking their syntax tree (numbers and + - * /
only), never with eval().
"""

from __future__ import annotations

import ast
import operator

from rlft.chat.tool_calls import parse_tool_calls

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    raise ValueError("not a plain arithmetic expression")


def evaluate_expression(text: str) -> float | None:
    """The value of an arithmetic expression, or None if it is not one."""
    try:
        return _value(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def right_call(prompts, completions, answer, **columns) -> list[float]:
    scores = []
    for completion, expected in zip(completions, answer):
        calls = parse_tool_calls(completion).calls
        expression = calls[0].arguments.get("expression") if calls and calls[0].name == "calculator" else None
        value = evaluate_expression(expression) if isinstance(expression, str) else None
        scores.append(float(value is not None and abs(value - float(expected)) < 1e-9))
    return scores
