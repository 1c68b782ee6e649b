"""Shape of the code under ``recformer/``, from the AST: the figures issue 17 asks for.

    python bench/code_stats.py            # this checkout
    python bench/code_stats.py --rev REV  # the tree of a git revision (read with git show)

- layout: lines per package folder and per file;
- function length (every def, nested ones included, decorators excluded): median, p90, max and
  the count over 50 and over 60 lines;
- comment lines (``#``) and docstring lines per line of code (the rest, blank lines aside);
- how many places define each concept the issue names: ``getattr``/``hasattr`` probes in the
  module and callbacks, files with a function that counts FLOPs, files that read the muP switch
  (``.mup``), literal tuples listing the batch's fields;
- the house's bounds (issues 17 and 30): the functions over ``MAX_FUNCTION_LINES``, the files over
  ``MAX_FILE_LINES``, the function-length distribution, and every import circle between modules
  of ``recformer`` (``import_circles``; ``tests/test_house.py`` keeps all three at zero).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import statistics
import subprocess
import tokenize
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH_FIELDS = {"label", "weight", "group", "target_item", "cat", "dense", "emb", "hist_item", "hist_cat"}
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 600
LENGTH_BINS = (10, 20, 30, 40, 50, 60)
"""Upper edges of the function-length distribution's bins (the last bin: over 60)."""


def sources(rev: str | None) -> dict[str, str]:
    """``{path: text}`` of every ``recformer/**/*.py``, in the work tree or at ``rev``."""
    if rev is None:
        return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "recformer").rglob("*.py"))}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "recformer/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        n: subprocess.run(
            ["git", "show", f"{rev}:{n}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        for n in names
        if n.endswith(".py")
    }


def _is_string(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def line_kinds(text: str, tree: ast.Module) -> tuple[int, int, int]:
    """(code, comment, docstring) line counts; a line holding code and a comment counts as code."""
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for i, stmt in enumerate(body if isinstance(body, list) else []):
            # a docstring (first statement), or an attribute docstring after an assignment
            named = i == 0 or isinstance(body[i - 1], ast.Assign | ast.AnnAssign)
            if named and _is_string(stmt):
                doc_lines.update(range(stmt.lineno, stmt.end_lineno + 1))
    comment, code = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comment.add(tok.start[0])
        elif tok.type not in (
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            code.update(range(tok.start[0], tok.end[0] + 1))
    code -= doc_lines
    return len(code), len(comment - code), len(doc_lines)


def module_name(path: str) -> str:
    """``recformer/a/b.py`` -> ``recformer.a.b``; a package's ``__init__.py`` -> the package."""
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: str, tree: ast.Module, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the module at ``path`` imports anywhere: at module level,
    inside functions, under ``if TYPE_CHECKING:``, and by name in a string (``importlib``
    tables such as ``recformer.__main__.TOOLS``). Each is a circle's edge whether or not it runs
    at import time: a deferred import only hides the circle until someone moves it."""
    me = module_name(path)
    package = me.split(".") if path.endswith("__init__.py") else me.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in modules else base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
            out.add(node.value)
    return (out & modules) - {me}


def import_circles(files: dict[str, str]) -> list[list[str]]:
    """Each set of modules that import one another in a circle (a strongly connected component of
    the import graph with more than one module, Tarjan's algorithm), sorted."""
    modules = {module_name(p) for p in files}
    graph = {module_name(p): imports_of(p, ast.parse(t), modules) for p, t in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles)


def functions(files: dict[str, str]) -> list[tuple[int, str]]:
    """(lines, ``path:line name``) of every def, nested ones included, decorators excluded."""
    out = []
    for path, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((node.end_lineno - node.lineno + 1, f"{path}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def distribution(lengths: list[int]) -> dict[str, int]:
    """Functions per length bin: ``1-10``, ``11-20``, ... ``51-60``, ``over 60``."""
    edges = (0, *LENGTH_BINS)
    out = {f"{a + 1}-{b}": sum(a < x <= b for x in lengths) for a, b in zip(edges, edges[1:])}
    out[f"over {LENGTH_BINS[-1]}"] = sum(x > LENGTH_BINS[-1] for x in lengths)
    return out


def _field_names(node: ast.Tuple | ast.List) -> set[str]:
    """String constants of a literal tuple/list, or the first element of each of its tuples."""
    heads = [e.elts[0] if isinstance(e, ast.Tuple) and e.elts else e for e in node.elts]
    return {e.value for e in heads if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def stats(files: dict[str, str]) -> dict:
    lengths, per_folder, per_file = [], defaultdict(int), {}
    code = comment = doc = probes = 0
    mup_files, flops_files, batch_lists = set(), set(), 0
    for path, text in files.items():
        tree = ast.parse(text)
        n = len(text.splitlines())
        per_file[path] = n
        per_folder[str(Path(path).parent)] += n
        c, m, d = line_kinds(text, tree)
        code, comment, doc = code + c, comment + m, doc + d
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths.append(node.end_lineno - node.lineno + 1)
                if "flops" in node.name and "peak" not in node.name:  # peak_flops: a device table
                    flops_files.add(path)
            probe = isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr")
            if probe and (path.startswith("recformer/callbacks") or path.endswith("module.py")):
                probes += 1
            if isinstance(node, ast.Tuple | ast.List) and len(_field_names(node) & BATCH_FIELDS) >= 4:
                batch_lists += 1
        if re.search(r"\b(cfg|c|self|config)\.mup\b", text):  # reads the switch: decides something by it
            mup_files.add(path)
    lengths.sort()
    return {
        "files": len(files),
        "lines": sum(per_file.values()),
        "folders": dict(sorted(per_folder.items())),
        "functions": len(lengths),
        "fn_median": statistics.median(lengths),
        "fn_p90": lengths[int(0.9 * (len(lengths) - 1))],
        "fn_max": lengths[-1],
        "fn_over_50": sum(x > 50 for x in lengths),
        "fn_over_60": sum(x > 60 for x in lengths),
        "code_lines": code,
        "comment_per_code": round(comment / code, 3),
        "docstring_per_code": round(doc / code, 3),
        "getattr_hasattr_probes_module_callbacks": probes,
        "files_counting_flops": len(flops_files),
        "files_branching_on_mup": len(mup_files),
        "batch_field_lists": batch_lists,
        "largest_files": sorted(per_file.items(), key=lambda kv: -kv[1])[:8],
        "fn_length_distribution": distribution(lengths),
        "functions_over_60": [f"{where} ({n})" for n, where in functions(files) if n > MAX_FUNCTION_LINES],
        "files_over_600": [f"{p} ({n})" for p, n in per_file.items() if n > MAX_FILE_LINES],
        "import_circles": [" <-> ".join(c) for c in import_circles(files)],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default=None, help="a git revision (default: the work tree)")
    a = p.parse_args()
    s = stats(sources(a.rev))
    for k, v in s.items():
        if isinstance(v, dict):
            print(f"{k}:")
            for kk, vv in v.items():
                print(f"  {kk:32s} {vv}")
        elif isinstance(v, list) and v and isinstance(v[0], str):
            print(f"{k}: {len(v)}" + "".join(f"\n  {x}" for x in v))
        elif isinstance(v, list):
            print(f"{k}: " + (", ".join(f"{kk} {vv}" for kk, vv in v) or "none"))
        else:
            print(f"{k:42s} {v}")


if __name__ == "__main__":
    main()
