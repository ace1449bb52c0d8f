"""The layers of pipeline/ (pipeline/__init__.py, ARCHITECTURE.md), checked on the imports.

- ``pipeline.shards`` (the contract) imports no other layer; ``core`` (the algorithms) only
  ``shards``; ``beam`` (the jobs) ``shards`` and ``core``; ``cli`` any of them. The shared
  command-line plumbing (``pipeline.options``, ``pipeline.console``) imports no layer.
- ``shards`` and ``core`` load no Apache Beam, even transitively (a fresh interpreter).
- trainer/, model/ and finetune/ never import ``pipeline.beam`` or ``pipeline.cli``.
- report/ (what a run wrote, read back) imports none of trainer/, model/, finetune/, torch or
  DeepSpeed, and of pipeline/ only the contract and the plumbing: it runs on the base install.
- No import circle among the project's modules, counting imports inside functions too
  (the graph of ``import`` statements, by :func:`imports_of`, searched for a cycle).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "trainer", "model", "finetune", "report")
LAYERS = {
    "shards": set(),
    "core": {"shards"},
    "beam": {"shards", "core"},
    "cli": {"shards", "core", "beam"},
}
SHARED = ("pipeline.options", "pipeline.console")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The modules ``path`` imports anywhere in it, as absolute names (``from x import y``
    counts ``x.y`` when that is a module of ours, else ``x``)."""
    package = (
        module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    )
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if _is_ours(full) else base)
    return out


def _is_ours(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def test_each_layer_imports_only_the_layers_below_it():
    problems = []
    for name, path in our_modules().items():
        parts = name.split(".")
        if parts[0] != "pipeline":
            continue
        layer = parts[1] if len(parts) > 2 or (ROOT / "pipeline" / parts[-1]).is_dir() else None
        layer = "cli" if name == "pipeline.__main__" else layer  # the entry point runs the CLI
        allowed = LAYERS.get(layer, set()) | {layer}
        for imported in imports_of(path):
            bits = imported.split(".")
            crosses = bits[0] == "pipeline" and len(bits) > 1 and bits[1] in LAYERS
            if crosses and (name in SHARED or bits[1] not in allowed):
                problems.append(f"{name} imports {imported}")
            if layer in ("shards", "core") and bits[0] == "apache_beam":
                problems.append(f"{name} imports {imported}")
    assert not problems, "\n".join(problems)


def test_the_contract_and_the_algorithms_load_no_beam():
    names = [n for n in our_modules() if n.startswith(("pipeline.shards", "pipeline.core"))]
    code = "import sys\n" + "".join(f"import {n}\n" for n in names)
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert len(names) >= 12 and out.stdout.strip() == "[]", out.stdout


def test_training_never_imports_the_beam_jobs_or_the_pipeline_commands():
    problems = [
        f"{name} imports {imported}"
        for name, path in our_modules().items()
        if name.split(".")[0] in ("trainer", "model", "finetune")
        for imported in imports_of(path)
        if imported.startswith(("pipeline.beam", "pipeline.cli"))
    ]
    assert not problems, "\n".join(problems)


def test_reports_import_nothing_of_the_training_stack():
    problems = [
        f"{name} imports {imported}"
        for name, path in our_modules().items()
        if name.split(".")[0] == "report"
        for imported in imports_of(path)
        if imported.split(".")[0] in ("trainer", "model", "finetune", "torch", "deepspeed")
        or imported.startswith(("pipeline.beam", "pipeline.cli", "pipeline.core"))
    ]
    assert len([n for n in our_modules() if n.startswith("report.")]) >= 2
    assert not problems, "\n".join(problems)


def test_no_import_circle():
    modules = our_modules()
    graph = {
        name: {i for i in imports_of(path) if i in modules and i != name}
        for name, path in modules.items()
    }
    for name in graph:  # a package's __init__ is not an edge to its own modules
        graph[name] = {i for i in graph[name] if not name.startswith(i + ".")}
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_imports_of_resolves_relative_and_module_imports(tmp_path):
    names = imports_of(ROOT / "trainer" / "loop.py")
    assert {"trainer.checkpoint", "trainer.data", "pipeline.core.rng", "torch"} <= names


def test_the_formatter_has_the_last_word():
    """One way to lay out code: ``ruff format``'s (scripts/test.sh checks it). A marker that
    turns it off for a line or a block would be a second way."""
    markers = re.compile(r"#\s*fmt:\s*(skip|off|on)\b")
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = [
        f"{name}:{i}"
        for name in tracked
        for i, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
        if markers.search(line)
    ]
    assert not found, "formatter markers: " + ", ".join(found)
