#!/usr/bin/env python3
"""check-function-length.py — no function in the repository is longer than 100 lines.

What it is: the check CI runs over every tracked C++ and Python file (git ls-files): a Python
function's lines are ast's, from its `def` (decorators excluded) to its last line, docstring
included; a C++ function's are from the line its signature starts on to its closing brace, found by
scanning braces with comments, strings and character literals blanked (a lambda counts toward the
function it is written in; a class body is not a function, its member functions are). Prints each
function over the limit as path:line: name has N lines, and exits 1 when there is one.
What it is not: a parser of C++ (a macro that opens a brace without a parenthesised header is not
seen as a function), nor a style checker of anything but length.
"""
import ast
import re
import subprocess
import sys

LIMIT = 100
CPP = (".cpp", ".cc", ".h", ".hpp", ".cu")
NOT_FUNCTIONS = re.compile(r"^\s*(?:template\s*<[^;{]*>\s*)?(?:namespace|class|struct|union|enum|extern)\b")
CONTROL = re.compile(r"(?:^|[^\w])(?:if|for|while|switch|catch|do|else|return)\s*(?:\(|$)")


def blank_literals(text):
    """The text with preprocessor lines, comments, string and character literals replaced by spaces
    (newlines kept)."""
    pattern = re.compile(r'^[ \t]*#(?:[^\n]*\\\n)*[^\n]*|//[^\n]*|/\*.*?\*/|R"(\w*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S | re.M)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def cpp_functions(text):
    """(first line, last line, name) of each C++ function body outside another function."""
    code, found, stack, header_start = blank_literals(text), [], [], 0
    for i, ch in enumerate(code):
        if ch in ";}" and not any(kind == "function" for kind, _ in stack):
            header_start = i + 1
        if ch == "{":
            inside = any(kind == "function" for kind, _ in stack)
            header = code[header_start:i]
            is_function = (not inside and ")" in header and not NOT_FUNCTIONS.search(header)
                           and not CONTROL.search(header.split("(")[0] + "(") and "=" not in header.split("(")[0])
            stack.append(("function" if is_function else "block", header_start if is_function else i))
            if not inside:
                header_start = i + 1
        elif ch == "}" and stack:
            kind, start = stack.pop()
            if kind == "function":
                header = code[start:code.index("{", start)]
                first = code.count("\n", 0, start + len(header) - len(header.lstrip())) + 1
                name = re.findall(r"([\w:~]+)\s*\(", header)
                found.append((first, code.count("\n", 0, i) + 1, name[0] if name else "?"))
            if not any(k == "function" for k, _ in stack):
                header_start = i + 1
    return found


def python_functions(text):
    """(first line, last line, name) of each Python function and method."""
    return [(n.lineno, n.end_lineno, n.name) for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def main():
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    over = []
    for path in files:
        if not (path.endswith(CPP) or path.endswith(".py")):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        functions = python_functions(text) if path.endswith(".py") else cpp_functions(text)
        over += ["%s:%d: %s has %d lines" % (path, a, name, b - a + 1) for a, b, name in functions if b - a + 1 > LIMIT]
    for line in over:
        print(line)
    print("check-function-length: %d function(s) over %d lines" % (len(over), LIMIT), file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
