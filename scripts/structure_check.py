#!/usr/bin/env python3
"""No function over --max-function lines, no file over --max-file lines.

Issue 35's rule for evaluator/, search/ and server/ (the ctest
`structure_check` runs it on them; `structure_check_selftest` checks that it
fails on an over-long function or file):

    scripts/structure_check.py --max-function 120 --max-file 700 evaluator search server

C++ (.cc, .h, .inc, .cu, .cuh): a function definition is a line that starts a
declarator `name(` (at any indentation: free functions, members defined in a
class, functions in an indented namespace; not if/for/while/switch/catch, not
a call or a lambda, whose parentheses do not close before the `{`), and it
ends at the first later line that is only `}` at the same indentation. A lambda
is part of the function that holds it. Python: every def, by ast. A file is
over when it has more lines than --max-file; no exemption. Exit status 1 when
anything is over, 0 otherwise.
"""
import argparse
import ast
import pathlib
import re
import sys

CXX_SUFFIXES = (".cc", ".h", ".inc", ".cu", ".cuh")
CXX_START = re.compile(r"^(\s*)[A-Za-z_][\w:<>,\s\*&~]*\b(~?[\w:]+)\s*\(")
# Lines that look like `name(` but do not start a definition.
NOT_A_DEFINITION = re.compile(
    r"^\s*(if|for|while|switch|catch|return|else|do|case|namespace|class|struct|union|enum|using|typedef)\b")
KEYWORD_NAMES = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype",
                 "static_assert", "defined"}


def _parens_close(text):
    """True when every '(' in text is closed and the text holds at least one pair."""
    depth, seen = 0, False
    for ch in text:
        if ch == "(":
            depth += 1
            seen = True
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False
    return seen and depth == 0


def cxx_functions(lines):
    """(name, first line, length) of each C++ function definition."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        m = CXX_START.match(line)
        if (not m or line.lstrip().startswith(("#", "//", "*", "/*")) or NOT_A_DEFINITION.match(line)
                or m.group(2).split("::")[-1] in KEYWORD_NAMES or line.rstrip().endswith(";")):
            i += 1
            continue
        indent = m.group(1)
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(("{", ";", "}")):
            j += 1
        if j >= len(lines) or not lines[j].rstrip().endswith("{"):
            i = j + 1  # a declaration, or a definition on one line
            continue
        head = " ".join(lines[i:j + 1]).rstrip()[:-1]
        # A call that takes a lambda, `Foo(a, [&](x) {`, leaves a parenthesis open.
        if not _parens_close(head):
            i += 1
            continue
        close = indent + "}"
        k = j + 1
        while k < len(lines) and lines[k].rstrip() != close:
            body = lines[k]
            if body.strip() and len(body) - len(body.lstrip()) < len(indent):
                break  # left the enclosing block: not a definition after all
            k += 1
        if k < len(lines) and lines[k].rstrip() == close:
            out.append((m.group(2), i + 1, k - i + 1))
            i = k + 1
            continue
        i += 1
    return out


def py_functions(text):
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.name, node.lineno, node.end_lineno - node.lineno + 1))
    return out


def check(roots, max_function, max_file):
    """Lines naming each function and file over the limits."""
    found = []
    for root in roots:
        for path in sorted(pathlib.Path(root).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix != ".py" and path.suffix not in CXX_SUFFIXES:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            lines = text.splitlines()
            funcs = py_functions(text) if path.suffix == ".py" else cxx_functions(lines)
            for name, line, n in funcs:
                if n > max_function:
                    found.append(f"{path}:{line}: {name} is {n} lines (limit {max_function})")
            if len(lines) > max_file:
                found.append(f"{path}: {len(lines)} lines (limit {max_file})")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="+", help="folders to check")
    ap.add_argument("--max-function", type=int, default=120)
    ap.add_argument("--max-file", type=int, default=700)
    args = ap.parse_args()
    for root in args.root:
        if not pathlib.Path(root).is_dir():
            print(f"{root}: not a folder")
            return 2
    over = check(args.root, args.max_function, args.max_file)
    for line in over:
        print(line)
    print(f"{len(over)} over the limits" if over else "nothing over the limits")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
