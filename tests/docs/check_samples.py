#!/usr/bin/env python3
"""Every ```cpp block in docs/*.md is compiled (and the short programs run) so the docs cannot drift.

    check_samples.py generate --docs DIR --out DIR    write the C++ sources and samples.json (CMake,
                                                      at configure time; files are rewritten only
                                                      when their text changes)
    check_samples.py run --docs DIR --manifest FILE --programs FILE
                                                      run the runnable programs (CTest docs_samples)
    check_samples.py selftest --compile-commands FILE  a malformed block is reported as page:line
                                                      (CTest docs_samples_malformed)

Kinds of block, by the fence's info string:

    ```cpp               with `int main`: a program; without: a fragment, compiled as the body of
                         a function. Every program is linked into one executable, docs_programs
                         (each in a namespace of its own, its main renamed; `docs_programs NAME
                         ARGS...` runs one): eight programs cost eight links of the static
                         libraries, some 250 s of compiling, before they shared one.
    ```cpp namespace     declarations (a module, a callback) at namespace scope; fragments and
                         programs later on the same page see them
    ```cpp run           a program that the test suite also runs (exit code 0 expected); arguments
                         go in an HTML comment on the line after the closing fence:
                         <!-- run: --max-steps 5 -->   (the comment alone also marks it runnable)

Every generated line carries a `#line "docs/<page>.md"` directive, so a compiler error names the
page and the line of the Markdown file. Structural problems (an unclosed fence, an unknown
marker, `run` on a fragment) are reported as `docs/<page>.md:<line>: ...` with exit code 1.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^(\s*)```(.*)$")
RUN_COMMENT = re.compile(r"^\s*<!--\s*run:(.*?)-->\s*$")
MAIN = re.compile(r"\bint\s+main\s*\(")
INCLUDE = re.compile(r"^\s*#\s*include\b")
KNOWN_MARKERS = {"namespace", "run"}

# What every generated file starts with: the umbrella header (LibTorch's API included) and the
# standard headers samples use without saying so.
PRELUDE = """\
#include <volt/volt.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>
"""


class DocsError(Exception):
    pass


class Block:
    def __init__(self, page, line, kind, code, args=None):
        self.page = page  # path as given (for #line and messages)
        self.line = line  # 1-based line of the first code line
        self.kind = kind  # "fragment", "namespace", "program"
        self.code = code  # list of lines
        self.args = args  # None: not run; else a list of arguments

    @property
    def ident(self):
        return f"{page_ident(self.page)}_{self.line}"


def page_ident(page):
    return re.sub(r"[^A-Za-z0-9]", "_", os.path.splitext(os.path.basename(page))[0])


def extract(page, text):
    """The ```cpp blocks of one page; raises DocsError naming page:line on malformed ones."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, info = match.group(1), match.group(2).strip()
        start = i + 1  # 1-based line of the fence
        words = info.split()
        # Find the closing fence (same or less indentation, only backticks).
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise DocsError(f"{page}:{start}: the code block opened here is never closed (```)")
        if words and words[0] in ("cpp", "c++"):
            markers = words[1:]
            unknown = [m for m in markers if m not in KNOWN_MARKERS]
            if unknown:
                raise DocsError(f"{page}:{start}: unknown marker {unknown[0]!r} after ```cpp "
                                f"(known: {', '.join(sorted(KNOWN_MARKERS))})")
            code = [line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:j]]
            args = [] if "run" in markers else None
            if j + 1 < len(lines):
                comment = RUN_COMMENT.match(lines[j + 1])
                if comment:
                    args = shlex.split(comment.group(1))
            has_main = any(MAIN.search(line) for line in code)
            if "namespace" in markers:
                kind = "namespace"
                if has_main:
                    raise DocsError(f"{page}:{start}: a ```cpp namespace block cannot hold main()")
            else:
                kind = "program" if has_main else "fragment"
            if args is not None and kind != "program":
                raise DocsError(f"{page}:{start}: only a complete program (with int main) can be run; "
                                f"this block is a {kind}")
            if not any(line.strip() for line in code):
                raise DocsError(f"{page}:{start}: empty ```cpp block")
            blocks.append(Block(page, start + 1, kind, code, args))
        i = j + 1
    return blocks


def line_directive(block, offset=0):
    return f'#line {block.line + offset} "{block.page}"'


def split_includes(block):
    """(include lines with #line directives, the other lines with a leading #line)."""
    includes, body = [], []
    for n, line in enumerate(block.code):
        if INCLUDE.match(line):
            includes.append(line_directive(block, n))
            includes.append(line)
            body.append("")  # keep the numbering of what follows
        else:
            body.append(line)
    return includes, [line_directive(block)] + body


def fragments_source(page, blocks):
    """One translation unit: the page's namespace blocks and fragments, in order."""
    includes, parts = [], []
    for block in blocks:
        if block.kind == "program":
            continue
        block_includes, body = split_includes(block)
        includes += block_includes
        if block.kind == "namespace":
            parts += body
        else:
            parts += [f"[[maybe_unused]] void fragment_{block.line}() {{"] + body + ["}"]
    ns = f"volt_docs_{page_ident(page)}"
    return "\n".join(["// Generated from " + page + " by tests/docs/check_samples.py; do not edit.",
                      PRELUDE] + includes + ["", f"namespace {ns} {{"] + parts + [f"}}  // namespace {ns}", ""])


# The header every program includes: how the dispatcher's main calls a program's main, whichever
# of the two signatures it has.
PROGRAMS_HEADER = """\
// Generated by tests/docs/check_samples.py; do not edit.
#pragma once

namespace volt_docs {
inline int call_main(int (*program)(), int, char**) { return program(); }
inline int call_main(int (*program)(int, char**), int argc, char** argv) { return program(argc, argv); }
}  // namespace volt_docs
"""


def program_source(block, namespace_blocks):
    """A program, preceded by the page's namespace blocks that come before it, in a namespace of its
    own with its main renamed, and a function the dispatcher calls (docs_programs_main.cpp)."""
    includes, parts = [], []
    for earlier in namespace_blocks:
        if earlier.line < block.line:
            block_includes, body = split_includes(earlier)
            includes += block_includes
            parts += body
    block_includes, body = split_includes(block)
    includes += block_includes
    end = end_of_main(body)  # body[0] is a #line directive: body[k] is the page's line block.line + k - 1
    body = body[:end] + ["  return 0;  // as main does when it flows off its end",
                         line_directive(block, end - 1)] + body[end:]
    ns = f"volt_docs_{block.ident}"
    return "\n".join(["// Generated from " + block.page + " by tests/docs/check_samples.py; do not edit.",
                      PRELUDE, '#include "docs_programs.h"'] + includes +
                     ["", f"namespace {ns} {{"] + parts + ["#define main program_main"] + body +
                     ["#undef main", f"}}  // namespace {ns}", "",
                     f"int volt_docs_run_{block.ident}(int argc, char** argv) {{",
                     f"  return volt_docs::call_main({ns}::program_main, argc, argv);", "}", ""])


def end_of_main(lines):
    """The index of the line holding main's closing brace, where program_source adds `return 0;`:
    flowing off the end returns 0 from main only, not from the function it is renamed to. Braces in
    strings, characters and // comments do not count."""
    start = next(i for i, line in enumerate(lines) if MAIN.search(line))
    depth, opened = 0, False
    for i in range(start, len(lines)):
        code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'', '""', lines[i]).split("//")[0]
        for char in code:
            if char == "{":
                depth, opened = depth + 1, True
            elif char == "}":
                depth -= 1
                if opened and depth == 0:
                    return i
    raise DocsError(f"{lines[start]}: main's closing brace not found")


def dispatcher_source(programs):
    """main(): `docs_programs NAME ARGS...` runs the program NAME (docs_<page>_<line>) with ARGS."""
    declarations = [f"int volt_docs_run_{b.ident}(int argc, char** argv);" for b in programs]
    table = [f'    {{"docs_{b.ident}", volt_docs_run_{b.ident}}},' for b in programs]
    return "\n".join(["// Generated by tests/docs/check_samples.py; do not edit.", "#include <cstring>",
                      "#include <iostream>", ""] + declarations + [
        "",
        "int main(int argc, char** argv) {",
        "  struct Program {",
        "    const char* name;",
        "    int (*run)(int, char**);",
        "  };",
        "  const Program programs[] = {"] + table + [
        '    {"", nullptr}};',
        "  for (const Program& program : programs) {",
        "    if (argc >= 2 && program.run != nullptr && std::strcmp(argv[1], program.name) == 0) {",
        "      argv[1] = argv[0];  // the program sees its own arguments after argv[0]",
        "      return program.run(argc - 1, argv + 1);",
        "    }",
        "  }",
        '  std::cerr << "usage: docs_programs NAME [ARGS...]; NAME is one of:";',
        '  for (const Program& program : programs) std::cerr << " " << program.name;',
        '  std::cerr << "\\n";',
        "  return 2;",
        "}", ""])


def write_if_changed(path, text):
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def pages_of(docs):
    return sorted(os.path.join(docs, name) for name in os.listdir(docs) if name.endswith(".md"))


def extract_all(docs):
    result = {}
    for page in pages_of(docs):
        with open(page, encoding="utf-8") as f:
            result[page] = extract(page, f.read())
    return result


def manifest_of(pages):
    programs = []
    for page, blocks in pages.items():
        for block in blocks:
            if block.kind == "program":
                programs.append({"target": f"docs_{block.ident}", "page": page, "line": block.line - 1,
                                 "args": block.args})
    return {"pages": {page: len(blocks) for page, blocks in pages.items()}, "programs": programs}


def generate(docs, out):
    pages = extract_all(docs)
    os.makedirs(out, exist_ok=True)
    wanted = set()
    for page, blocks in pages.items():
        if any(b.kind != "program" for b in blocks):
            name = f"fragments_{page_ident(page)}.cpp"
            wanted.add(name)
            write_if_changed(os.path.join(out, name), fragments_source(page, blocks))
        namespaces = [b for b in blocks if b.kind == "namespace"]
        for block in blocks:
            if block.kind == "program":
                name = f"docs_{block.ident}.cpp"
                wanted.add(name)
                write_if_changed(os.path.join(out, name), program_source(block, namespaces))
    programs = [b for blocks in pages.values() for b in blocks if b.kind == "program"]
    wanted.add("programs_main.cpp")
    write_if_changed(os.path.join(out, "programs_main.cpp"), dispatcher_source(programs))
    write_if_changed(os.path.join(out, "docs_programs.h"), PROGRAMS_HEADER)
    for name in os.listdir(out):
        if name.endswith(".cpp") and name not in wanted:
            os.remove(os.path.join(out, name))
    write_if_changed(os.path.join(out, "samples.json"), json.dumps(manifest_of(pages), indent=1) + "\n")


def run(docs, manifest_path, programs_binary, timeout):
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    current = manifest_of(extract_all(docs))
    if current != manifest:
        print(f"the docs changed since the build was configured ({manifest_path} is stale). "
              "HINT: rebuild (ninja re-runs CMake, which regenerates the samples) and run the test again.")
        return 1
    failures = 0
    runnable = [p for p in manifest["programs"] if p["args"] is not None]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for program in runnable:
        where = f"{program['page']}:{program['line']}"
        command = [programs_binary, program["target"]] + program["args"]
        with tempfile.TemporaryDirectory(prefix="volt-docs-") as cwd:
            start = time.monotonic()
            try:
                done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"{where}: FAILED: `{shlex.join(command)}` ran past {timeout} s")
                failures += 1
                continue
            seconds = time.monotonic() - start
        if done.returncode != 0:
            print(f"{where}: FAILED: `{shlex.join(command)}` exited with {done.returncode}\n"
                  f"--- stdout\n{done.stdout[-4000:]}--- stderr\n{done.stderr[-4000:]}")
            failures += 1
        else:
            print(f"{where}: ok ({seconds:.1f} s): {shlex.join(command)}")
    blocks = sum(manifest["pages"].values())
    print(f"{blocks} ```cpp blocks in {len(manifest['pages'])} pages compiled; "
          f"{len(runnable) - failures}/{len(runnable)} runnable programs passed")
    return 1 if failures else 0


def selftest(compile_commands):
    """A malformed block is named by page:line, structurally and by the compiler."""
    failures = []

    def expect_error(text, needle):
        try:
            extract("docs/broken.md", text)
        except DocsError as e:
            if needle not in str(e):
                failures.append(f"expected {needle!r} in {e}")
            return
        failures.append(f"no error for:\n{text}")

    expect_error("# t\n\n```cpp\nint x = 1;\n", "docs/broken.md:3: the code block opened here is never closed")
    expect_error("a\n```cpp rnu\nint main() {}\n```\n", "docs/broken.md:2: unknown marker 'rnu'")
    expect_error("```cpp run\nvolt::Trainer t;\n```\n", "docs/broken.md:1: only a complete program")
    expect_error("```cpp\nint x;\n```\n<!-- run: -->\n", "docs/broken.md:1: only a complete program")

    # The compiler names the Markdown page and line: compile a broken fragment with the exact
    # command CMake uses for a real page (the same flags, the precompiled torch header).
    with open(compile_commands, encoding="utf-8") as f:
        commands = json.load(f)
    real = [c for c in commands if os.path.basename(c["file"]).startswith("fragments_")]
    if not real:
        failures.append(f"no fragments_*.cpp in {compile_commands}")
    else:
        entry = real[0]
        with tempfile.TemporaryDirectory(prefix="volt-docs-selftest-") as tmp:
            page = os.path.join(tmp, "broken.md")
            text = ("# Broken\n\nText.\n\n```cpp\nvolt::TrainerOptions options;\n"
                    "options.max_epochz = 3;\n```\n")
            with open(page, "w", encoding="utf-8") as f:
                f.write(text)
            source = os.path.join(tmp, "fragments_broken.cpp")
            with open(source, "w", encoding="utf-8") as f:
                f.write(fragments_source(page, extract(page, text)))
            argv = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
            argv = [a for a in argv if a not in ("ccache",) and not a.endswith("/ccache")]
            # Drop -o <obj> and -c <file>; compile the broken source for syntax and types only.
            cleaned, skip = [], False
            for a in argv:
                if skip:
                    skip = False
                    continue
                if a in ("-o", "-c", "-MF", "-MT", "-MQ"):
                    skip = True
                    continue
                if a in ("-MD", "-MMD") or a == entry["file"]:
                    continue
                cleaned.append(a)
            done = subprocess.run(cleaned + ["-fsyntax-only", source], cwd=entry["directory"],
                                  capture_output=True, text=True, timeout=600)
            needle = f"{page}:7"
            if done.returncode == 0:
                failures.append("a fragment with a misspelt option compiled")
            elif needle not in done.stderr:
                failures.append(f"the compiler error does not name {needle}:\n{done.stderr[-3000:]}")
            else:
                first = next(l for l in done.stderr.splitlines() if needle in l)
                print(f"the compiler names the page and line: {first}")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--docs", required=True)
    g.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--docs", required=True)
    r.add_argument("--manifest", required=True)
    r.add_argument("--programs", required=True, help="the docs_programs executable")
    r.add_argument("--timeout", type=float, default=180)
    s = sub.add_parser("selftest")
    s.add_argument("--compile-commands", required=True)
    args = parser.parse_args()
    try:
        if args.command == "generate":
            generate(args.docs, args.out)
            return 0
        if args.command == "run":
            return run(args.docs, args.manifest, args.programs, args.timeout)
        return selftest(args.compile_commands)
    except DocsError as e:
        print(e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
