#!/usr/bin/env python3
"""Function and file lengths under a folder (issue 25's measure).

Reports every function over --max-function lines (C++: a definition that
starts at column 0 and ends at the matching column-0 brace; Python: ast) and
every file over --max-file lines whose first lines do not say why it is long
(a comment containing "long" or "why"). Exit status 1 when anything is over.

    scripts/structure_check.py evaluator [--max-function 120] [--max-file 700]
"""
import argparse
import ast
import pathlib
import re
import sys

CXX_START = re.compile(r"^[A-Za-z_][\w:<>,\s\*&~]*\b([\w:~]+)\s*\(.*")


def cxx_functions(lines):
    """(name, first line, length) of each column-0 function definition."""
    out, i = [], 0
    while i < len(lines):
        m = CXX_START.match(lines[i])
        if m and not lines[i].rstrip().endswith(";") and not lines[i].startswith(("namespace", "class", "struct", "using", "#")):
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{"):
                if lines[j].rstrip().endswith("}"):  # one-line body
                    i = j + 1
                    continue
                k = j + 1
                while k < len(lines) and lines[k].rstrip() != "}":
                    k += 1
                out.append((m.group(1), i + 1, k - i + 1))
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


def says_why(lines):
    head = "\n".join(lines[:12]).lower()
    return "long" in head or "why" in head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root", nargs="+")
    ap.add_argument("--max-function", type=int, default=120)
    ap.add_argument("--max-file", type=int, default=700)
    args = ap.parse_args()
    over = 0
    for root in args.root:
        for path in sorted(pathlib.Path(root).rglob("*")):
            if path.suffix not in (".cc", ".h", ".py") or "__pycache__" in path.parts:
                continue
            text = path.read_text()
            lines = text.splitlines()
            funcs = py_functions(text) if path.suffix == ".py" else cxx_functions(lines)
            for name, line, n in funcs:
                if n > args.max_function:
                    print(f"{path}:{line}: {name} is {n} lines")
                    over += 1
            if len(lines) > args.max_file and not says_why(lines):
                print(f"{path}: {len(lines)} lines, and its top does not say why")
                over += 1
    print(f"{over} over the limits" if over else "nothing over the limits")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
