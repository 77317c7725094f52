"""The package's import graph, read from the source (nothing is imported): depth, cycles, edges.

    python tools/import_graph.py            # the longest chain of module-level imports, and any cycle
    python tools/import_graph.py --all      # the same with imports inside functions counted too
    python tools/import_graph.py --edges    # every edge, one per line

A module's imports are the ``import`` / ``from ... import`` statements of ``trtllm_pipeline``
modules, resolved to the module they name (``from trtllm_pipeline.tasks import mmlu`` is an edge
to ``tasks.mmlu``); ``if TYPE_CHECKING:`` blocks are left out, since they never run. The depth is
the number of modules on the longest chain ``a -> b -> ... -> z``. The Python-backend model files
under ``triton/python_models/`` are left out: Triton, not this package, imports them.
``tests/test_architecture.py`` checks the layering with these same functions.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from pathlib import Path

PACKAGE = "trtllm_pipeline"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
SKIPPED = ("triton/python_models",)


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str  # dotted names without the package prefix: "runtimes.base"
    target: str
    in_function: bool  # the import runs when a function runs, not when the module is imported


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """``{"runtimes.base": path}`` for every module of the package (``""`` is the package itself)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(rel.as_posix().startswith(s) for s in SKIPPED):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, in_function: bool = False):
    """(import node, inside a function?) for every import that can run."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from ((n, in_function) for n in node.orelse if isinstance(n, (ast.Import, ast.ImportFrom)))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        else:
            inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _imports(node, inside)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = [PACKAGE, *module.split(".")] if module else [PACKAGE]
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges(root: Path = ROOT) -> list[Edge]:
    files = module_files(root)
    known = set(files)
    out = []

    def local(name: str) -> str | None:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None
        return name.removeprefix(PACKAGE).removeprefix(".")

    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, in_function in _imports(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [local(alias.name) for alias in node.names]
            else:
                base = local(_absolute(node, module, path.name == "__init__.py"))
                if base is not None:
                    # `from pkg import sub` imports the module pkg.sub; `from mod import name` the module mod.
                    subs = [f"{base}.{a.name}".lstrip(".") for a in node.names]
                    targets = [s if s in known else base for s in subs]
            for target in dict.fromkeys(t for t in targets if t is not None):
                if target != module:
                    out.append(Edge(module, target, in_function))
    return out


def graph(all_imports: bool = False, root: Path = ROOT) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {m: set() for m in module_files(root)}
    for e in edges(root):
        if all_imports or not e.in_function:
            out[e.source].add(e.target)
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component that has one (Tarjan), as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_closed_path(g, set(component)))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def _closed_path(g: dict[str, set[str]], component: set[str]) -> list[str]:
    start = min(component)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in g[path[-1]] if w in component)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return path + [start]
        fresh = [w for w in nxt if w not in seen]
        if not fresh:
            i = path.index(nxt[0])
            return path[i:] + [nxt[0]]
        path.append(fresh[0])
        seen.add(fresh[0])


def without_back_edges(g: dict[str, set[str]]) -> dict[str, set[str]]:
    out = {v: set(ws) for v, ws in g.items()}
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done

    def walk(v: str) -> None:
        state[v] = 1
        for w in sorted(g.get(v, ())):
            if state.get(w) == 1:
                out[v].discard(w)
            elif w not in state:
                walk(w)
        state[v] = 2

    for v in sorted(g):
        if v not in state:
            walk(v)
    return out


def longest_chain(g: dict[str, set[str]]) -> list[str]:
    """The longest import chain of an acyclic graph (modules in import order, importer first)."""
    memo: dict[str, list[str]] = {}

    def chain(v: str) -> list[str]:
        if v not in memo:
            memo[v] = [v] + max((chain(w) for w in sorted(g.get(v, ()))), key=len, default=[])
        return memo[v]

    return max((chain(v) for v in sorted(g)), key=len, default=[])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="count imports inside functions too")
    parser.add_argument("--edges", action="store_true", help="print every edge")
    args = parser.parse_args(argv)
    if args.edges:
        for e in edges():
            print(f"{e.source or PACKAGE} -> {e.target}" + ("  (in a function)" if e.in_function else ""))
        return 0
    g = graph(all_imports=args.all)
    found = cycles(g)
    for cycle in found:
        print("cycle: " + " -> ".join(cycle))
    if found:
        # Depth is undefined with cycles: measure a graph without them (the back edges of a depth-first
        # walk cut), whose longest chain is still a chain of the real graph.
        g = without_back_edges(g)
    chain = longest_chain(g)
    kind = "all imports" if args.all else "module-level imports"
    print(f"{len(g)} modules, depth {len(chain)} ({kind}{', cycles cut' if found else ''}):")
    print("  " + " -> ".join(chain))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
