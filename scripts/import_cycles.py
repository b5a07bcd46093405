#!/usr/bin/env python3
"""Import circles between the files of each crate.

Reads every `crate::` path in every .rs file of crates/*/src (use lines
and paths in code alike, outside comments), maps it to the file that
defines the module it names, and finds the strongly connected components
of that graph: files that import each other, directly or around a
circle. A module and its own children (a `mod.rs` or `foo.rs` and the
files under `foo/`) may import each other; those edges are left out.

The circles found must be exactly the ones recorded in
scripts/import_cycles.known (one line per circle: the crate, then its
files, sorted), so that a new circle fails CI, and one that is broken
must be taken off the list: the list only shrinks.

    python3 scripts/import_cycles.py           check against the list
    python3 scripts/import_cycles.py --write   rewrite the list
    python3 scripts/import_cycles.py --show    print each circle's edges
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KNOWN = Path(__file__).with_name("import_cycles.known")
PATH = re.compile(r"\b(crate|super)::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)")
GROUP = re.compile(r"\b(crate|super)::\{([^}]*)\}")
LINE_COMMENT = re.compile(r"//.*")
BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)


def module_of(src: Path, file: Path) -> tuple[str, ...]:
    """The module path a file defines: src/a/b.rs and src/a/b/mod.rs -> (a, b)."""
    rel = file.relative_to(src).with_suffix("")
    parts = rel.parts
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def imports(text: str, parent: tuple[str, ...]) -> set[tuple[str, ...]]:
    """The module paths `text` names, from the crate root; `super::` is
    taken from `parent`, the module above the file's own."""
    text = BLOCK_COMMENT.sub("", text)
    text = "\n".join(LINE_COMMENT.sub("", line) for line in text.splitlines())
    found = set()

    def resolved(kind: str, path: tuple[str, ...]) -> tuple[str, ...]:
        start = () if kind == "crate" else parent
        # `super::super::x`: each further `super` is one module higher.
        while path and path[0] == "super" and kind == "super":
            start, path = start[:-1], path[1:]
        return start + path

    for m in PATH.finditer(text):
        found.add(resolved(m.group(1), tuple(m.group(2).split("::"))))
    for m in GROUP.finditer(text):
        for item in re.split(r"[,\s]+", m.group(2)):
            item = item.strip()
            if item and re.match(r"[a-z_]", item):
                found.add(resolved(m.group(1), tuple(item.split("::"))))
    return found


def crate_graph(src: Path) -> dict[str, set[str]]:
    files = {f: module_of(src, f) for f in src.rglob("*.rs")}
    # A test module in a file of its own (`#[path]`) is not a module file.
    files = {f: m for f, m in files.items() if m}
    by_module = {m: f for f, m in files.items()}
    graph: dict[str, set[str]] = {}
    for f, mine in files.items():
        name = str(f.relative_to(src))
        graph.setdefault(name, set())
        # `super` in a.rs or a/mod.rs is a's parent module.
        for path in imports(f.read_text(errors="replace"), mine[:-1]):
            # The longest prefix of the path that is a module file.
            target = None
            for n in range(len(path), 0, -1):
                if path[:n] in by_module:
                    target = path[:n]
                    break
            if target is None or target == mine or target == ():
                continue
            # A module and its descendants (or ancestors) may use each other.
            if target[: len(mine)] == mine or mine[: len(target)] == target:
                continue
            graph[name].add(str(by_module[target].relative_to(src)))
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def found() -> dict[str, list[list[str]]]:
    result = {}
    for src in sorted(ROOT.glob("crates/*/src")):
        result[src.parent.name] = circles(crate_graph(src))
    return result


def lines(result: dict[str, list[list[str]]]) -> list[str]:
    return [f"{crate}: {' '.join(c)}" for crate, cs in result.items() for c in cs]


def main() -> int:
    result = found()
    now = lines(result)
    if "--write" in sys.argv:
        KNOWN.write_text("".join(line + "\n" for line in now))
        print(f"{KNOWN.name}: {len(now)} circle(s) recorded")
        return 0
    if "--show" in sys.argv:
        for src in sorted(ROOT.glob("crates/*/src")):
            graph = crate_graph(src)
            for c in circles(graph):
                print(f"{src.parent.name}: {len(c)} files")
                for f in c:
                    print(f"  {f} -> {', '.join(sorted(graph[f] & set(c)))}")
        return 0
    known = [line for line in KNOWN.read_text().splitlines() if line.strip()] if KNOWN.exists() else []
    new = [c for c in now if c not in known]
    gone = [c for c in known if c not in now]
    sizes = ", ".join(f"{crate}: {'+'.join(str(len(c)) for c in cs)} files" for crate, cs in result.items() if cs) or "none"
    if new or gone:
        for c in new:
            print(f"a new import circle (or a known one that grew or changed): {c}")
        for c in gone:
            print(f"a recorded circle is gone or changed; take it off {KNOWN.name}: {c}")
        print(f"(python3 scripts/import_cycles.py --show names the imports; --write records what is found now: {sizes})")
        return 1
    print(f"import circles as recorded ({sizes})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
