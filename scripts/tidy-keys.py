#!/usr/bin/env python3
"""Prints one line per source file, "<key> <file>", for scripts/check-tidy.sh's cache of clean results.

The key is a hash of everything clang-tidy's verdict on the file depends on: the clang-tidy version
and the .clang-tidy file (given as arguments), the file's compile command, and the contents of the
file and of every header it includes, as the build's last compile of it recorded them (ninja's deps
log). A file with no recorded dependencies (not built yet) gets the key "-", so it is always checked.
Paths under the checkout are written relative to it, so a clone in another folder finds the same keys.

usage: tidy-keys.py BUILD_DIR ROOT SALT FILE...
"""
import hashlib
import json
import os
import shlex
import subprocess
import sys


def main():
    build_dir, root, salt, files = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3], sys.argv[4:]
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = {os.path.realpath(e["file"]): e for e in json.load(f)}
    outputs = {}
    for path in files:
        entry = entries.get(os.path.realpath(path))
        output = entry and (entry.get("output") or output_of(entry))
        if output:
            outputs[path] = output
    deps = read_deps(build_dir, sorted(set(outputs.values())))
    content_hashes = {}

    def content_hash(dep):
        if dep not in content_hashes:
            try:
                with open(dep, "rb") as f:
                    content_hashes[dep] = hashlib.sha256(f.read()).hexdigest()
            except OSError:
                content_hashes[dep] = "missing"
        return content_hashes[dep]

    def relative(text):
        return text.replace(root + "/", "@ROOT@/")

    for path in files:
        output = outputs.get(path)
        if output is None or not deps.get(output):
            print("-", path)
            continue
        digest = hashlib.sha256(salt.encode())
        entry = entries[os.path.realpath(path)]
        digest.update(relative(entry.get("command") or " ".join(entry.get("arguments", []))).encode())
        files_read = set()
        for dep in set(deps[output]) | {os.path.realpath(path)}:
            files_read.add(dep if os.path.isabs(dep) else os.path.realpath(os.path.join(build_dir, dep)))
        # Sorted by the name written into the key, so that a checkout elsewhere sorts the same.
        for name, absolute in sorted((relative(a), a) for a in files_read):
            digest.update(f"\n{name} {content_hash(absolute)}".encode())
        print(digest.hexdigest(), path)


def output_of(entry):
    """The object file a compile command writes (CMake 3.25 writes no "output" key)."""
    words = entry.get("arguments") or shlex.split(entry.get("command", ""))
    for flag, value in zip(words, words[1:]):
        if flag == "-o":
            return value
    return None


def read_deps(build_dir, outputs):
    """{output: [dependency, ...]} from `ninja -t deps`, which reads the deps log without building."""
    if not outputs:
        return {}
    listing = subprocess.run(["ninja", "-C", build_dir, "-t", "deps", *outputs], capture_output=True, text=True)
    deps, current = {}, None
    for line in listing.stdout.splitlines():
        if not line.strip():
            current = None
        elif not line.startswith(" "):
            # "<output>: #deps N, deps mtime T (VALID)"; a stale record says STALE: not trusted.
            name, _, state = line.partition(": #deps")
            current = name if "(VALID)" in state else None
            if current is not None:
                deps[current] = []
        elif current is not None:
            deps[current].append(line.strip())
    return deps


if __name__ == "__main__":
    main()
