"""The cases a test cell ran, for the records and the feedback: every check call of the cell's
(instructor's) source, in order, with the arguments it ran with (world size, sizes, the seed the
judge drew), whether it is a hidden test, what is special about it (the source line's comment,
e.g. ``# a rank whose experts get no token``), and its outcome and message from the judge.

The judge answers a cell's calls of one check in source order (``distlab.grading.judge``), so the
i-th verdict of ``check_x`` is the i-th call of ``check_x``; a call with no verdict did not run
(the cell stopped before it).
"""
from __future__ import annotations

import ast
import collections
import html
import io
import json
import tokenize

BEGIN, END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
MESSAGE_CHARS = 600


def _hidden_lines(source: str) -> set[int]:
    lines, inside = set(), False
    for number, line in enumerate(source.splitlines(), 1):
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END:
            inside = False
        elif inside:
            lines.add(number)
    return lines


def _comments(source: str) -> dict[int, str]:
    """{line: its comment's text} of ``source``."""
    found = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                found[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return found


def _value(node: ast.AST):
    """A keyword's value as plain JSON data: the literal, else the expression's text."""
    try:
        value = ast.literal_eval(node)
        json.dumps(value)
        return value
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return ast.unparse(node)


def cell_cases(source: str, verdicts) -> list[dict]:
    """[{check, hidden, arguments, seed, special, status, message}] for each check call of a test
    cell's ``source``, given the judge's ``verdicts`` for the cell (objects with ``check``,
    ``status``, ``message``, ``seed``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    calls = sorted((node for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) and node.func.id.startswith("check_")),
                   key=lambda node: (node.lineno, node.col_offset))
    hidden, comments = _hidden_lines(source), _comments(source)
    by_check = collections.defaultdict(list)
    for verdict in verdicts:
        by_check[verdict.check].append(verdict)
    seen: collections.Counter = collections.Counter()
    cases = []
    for call in calls:
        name = call.func.id
        index, seen[name] = seen[name], seen[name] + 1
        verdict = by_check[name][index] if index < len(by_check[name]) else None
        arguments = {kw.arg: _value(kw.value) for kw in call.keywords if kw.arg is not None}
        seed = verdict.seed if verdict is not None else None
        if "seed" in arguments and seed is not None:
            arguments["seed"] = seed
        special = "; ".join(comments[n] for n in range(call.lineno, call.end_lineno + 1)
                            if n in comments)
        cases.append({"check": name, "hidden": call.lineno in hidden, "arguments": arguments,
                      "seed": seed, "special": special,
                      "status": verdict.status if verdict is not None else "not run",
                      "message": (verdict.message if verdict is not None else "")[:MESSAGE_CHARS]})
    for case in cases:
        if case["status"] == "not run":
            _why_not_run(case, cases)
    return cases


def _why_not_run(case: dict, cases: list[dict]) -> None:
    """A case the cell never reached: say so and why, with no seed (none was drawn; the source's
    ``fresh_seed()`` is the instructor's text, not a value)."""
    if not isinstance(case["arguments"].get("seed", 0), int):
        del case["arguments"]["seed"]
    stopped = next((c for c in cases if c["status"] not in ("pass", "not run")), None)
    if stopped is not None:
        kind = "hidden" if stopped["hidden"] else "visible"
        case["message"] = (f"the cell stopped at the {kind} case of "
                           f"{stopped['check']} above ({stopped['status']}); fix that one and "
                           f"this case runs, on a seed drawn then")
    else:
        case["message"] = ("the cell stopped before this call (an error in the cell, "
                           "its time limit or a dead kernel: see the cell's output)")


def describe_case(case: dict) -> str:
    """One line: ``check_x with world_size 4, hidden 21, seed 1234``, hidden or not, and what is
    special. Never the source's own text: the feedback shows no hidden test's code."""
    args = ", ".join(f"{k} {v}" for k, v in case["arguments"].items()) or "its defaults"
    kind = "hidden test" if case["hidden"] else "visible test"
    special = f" — {case['special']}" if case["special"] else ""
    return f"{case['check']} with {args} [{kind}{special}]"


def cases_output(cases: list[dict]):
    """A notebook output that lists the cases under their test cell, for the feedback."""
    from nbformat.v4 import new_output
    text = ["The grader ran these cases:"]
    rows = []
    for case in cases:
        outcome = case["status"] + (f": {case['message']}" if case["message"] else "")
        text.append(f"- {describe_case(case)}: {outcome}")
        rows.append(f"<tr><td><code>{html.escape(describe_case(case))}</code></td>"
                    f"<td>{html.escape(case['status'])}</td>"
                    f"<td><pre style='white-space: pre-wrap'>{html.escape(case['message'])}</pre>"
                    f"</td></tr>")
    table = ("<p>The grader ran these cases:</p><table><tr><th>case</th><th>outcome</th>"
             "<th>message</th></tr>" + "".join(rows) + "</table>")
    return new_output("display_data", data={"text/plain": "\n".join(text), "text/html": table})
