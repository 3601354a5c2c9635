#!/usr/bin/env python3
"""Rust files and functions that are too long, read from their source text.

    python3 tools/fnlen.py DIR MAX_FILE_LINES MAX_FN_LINES

Walks DIR for `.rs` files. Reports every file longer than MAX_FILE_LINES lines and every
`fn` item (free, method, nested, in tests too) whose body, from the line of `fn` to the line
of its closing brace, spans more than MAX_FN_LINES lines. Bodies are brace-matched after the
text of comments, string literals (raw ones too) and char literals is blanked out, so a brace
inside them does not count; a `fn` in a trait without a body (`fn x(&self);`) is no item here.
Exit status 1 when anything is reported, 0 otherwise.
"""
import os
import re
import sys


def blank(text):
    """The text with comments, strings and char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)

    def keep_lines(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(keep_lines(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and not _ident_before(text, i):
            m = re.match(r'r(#*)"', text[i:])
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == "b" and text.startswith('b"', i) and not _ident_before(text, i):
            out.append(" ")
            i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', '{'), not a lifetime ('a) or a label.
            m = re.match(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'", text[i:])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_before(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def long_functions(text, limit):
    """(name, first line, lines) of each fn item whose body spans more than `limit` lines."""
    code = blank(text)
    found = []
    for m in FN.finditer(code):
        # The body opens at the first `{` outside the signature's parentheses and brackets;
        # a `;` first means no body (a trait method's declaration).
        depth, k = 0, m.end()
        while k < len(code):
            ch = code[k]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif depth == 0 and ch in "{;":
                break
            k += 1
        if k >= len(code) or code[k] == ";":
            continue
        braces, j = 0, k
        while j < len(code):
            if code[j] == "{":
                braces += 1
            elif code[j] == "}":
                braces -= 1
                if braces == 0:
                    break
            j += 1
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, j) + 1
        if last - first + 1 > limit:
            found.append((m.group(1), first, last - first + 1))
    return found


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    root, max_file, max_fn = argv[1], int(argv[2]), int(argv[3])
    problems = 0
    for dp, _, fs in sorted(os.walk(root)):
        for f in sorted(fs):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dp, f)
            text = open(path, encoding="utf-8", errors="replace").read()
            lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
            if lines > max_file:
                print(f"{path}: {lines} lines (max {max_file})")
                problems += 1
            for name, line, length in long_functions(text, max_fn):
                print(f"{path}:{line}: fn {name} is {length} lines (max {max_fn})")
                problems += 1
    if problems:
        print(f"{problems} over the limits ({max_file} lines a file, {max_fn} a function)")
        return 1
    print(f"no file over {max_file} lines and no function over {max_fn} lines under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
