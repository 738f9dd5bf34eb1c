"""The package's import graph: no cycles among ``kernelcamp`` modules, and kernels never import it.

Walks every module of ``kernelcamp`` with ``ast`` (nothing is imported), counting every import
statement, also those inside functions (a lazy import is still a dependency; hiding a cycle inside a
function is how the serving/deploy/sweep knot grew). Imports under ``if TYPE_CHECKING:`` are left
out: they never run.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kernelcamp"


def _module_name(path: Path) -> str:
    parts = list((path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports at run time (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import module`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def package_graph() -> dict[str, set[str]]:
    """{module: kernelcamp modules it imports}; a package's ``__init__`` counts as the package."""
    files = {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        # the longest known module that names each import (``kernelcamp.deploy.ssh.SshRunner``: ``...ssh``)
        graph[name] = {m for imp in runtime_imports(path) for m in _known(imp, files) if m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of module names (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state:
                got = dfs(dep)
                if got:
                    return got
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            got = dfs(node)
            if got:
                return got
    return None


def test_the_walk_sees_the_package() -> None:
    graph = package_graph()
    assert "kernelcamp.cli" in graph and "kernelcamp.spec" in graph
    assert "kernelcamp.errors" in graph["kernelcamp.spec"]


def test_kernelcamp_has_no_import_cycle() -> None:
    cycle = find_cycle(package_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_kernels_never_import_kernelcamp_at_run_time() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(i for i in runtime_imports(p) if i.split(".")[0] == PACKAGE)
        for p in sorted((ROOT / "kernels").rglob("*.py"))
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, (
        f"a kernel imports only torch and triton at run time (kernelcamp under TYPE_CHECKING): {offenders}"
    )


def test_type_checking_imports_are_not_run_time_imports(tmp_path: Path) -> None:
    src = tmp_path / "k.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kernelcamp.variant import Variant\n"
        "def f():\n    import kernelcamp.io\n"
    )
    assert {i for i in runtime_imports(src) if i.startswith("kernelcamp")} == {"kernelcamp.io"}


def stage_closure(stage_file: Path, graph: dict[str, set[str]] | None = None) -> set[str]:
    """The ``kernelcamp`` modules a stage script runs: its imports, theirs (lazy ones too), the modules they start
    as processes (:func:`launched_modules`: the deploy's server), and the packages above each (their ``__init__``
    runs first). ``graph``: :func:`package_graph`, computed when not given."""
    graph = package_graph() if graph is None else graph
    seen: set[str] = set()
    todo = [m for imp in runtime_imports(stage_file) for m in _known(imp, graph)]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += sorted(graph[m]) + sorted((launched_modules(ROOT / _module_file(m)) | _by_name(m)) & set(graph))
    return seen | {".".join(m.split(".")[:n]) for m in seen for n in range(1, m.count(".") + 1)}


def _by_name(module: str) -> set[str]:
    """The modules ``module`` imports by name at run time (``importlib.import_module``), unseen by an import walk:
    the deploy kinds of ``kernelcamp.deploy.KINDS``."""
    if module != "kernelcamp.deploy":
        return set()
    from kernelcamp.deploy import KINDS

    return set(KINDS.values())


def launched_modules(path: Path) -> set[str]:
    """The ``kernelcamp`` modules ``path`` starts as a process, written ``"-m", "kernelcamp...."`` in an argument
    list; for ``kernelcamp.cli`` also the module of the command that follows (``"serve"``: kernelcamp.serve.server,
    which the CLI imports by name, unseen by an import walk)."""
    import re

    from kernelcamp.cli import COMMANDS

    found = set()
    for m in re.finditer(r'"-m",\s*"(kernelcamp(?:\.\w+)*)"(?:,\s*"(\w+)")?', path.read_text()):
        found.add(m.group(1))
        if m.group(1) == "kernelcamp.cli" and m.group(2) in COMMANDS:
            found.add(COMMANDS[m.group(2)][0])
    return found


def _known(imp: str, modules: Mapping[str, object]) -> list[str]:
    """The longest module of ``modules`` that names ``imp``, as a one-item list; ``[]`` for none."""
    parts = imp.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return [".".join(parts[:n])]
    return []


def _module_file(module: str) -> str:
    path = ROOT / Path(*module.split("."))
    return str((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(ROOT))


def test_every_dvc_stage_depends_on_the_code_it_runs() -> None:
    """A module a stage imports but does not list in dvc.yaml's deps can change without DVC rerunning the stage:
    its record then no longer matches the code (the report stage lacked kernelcamp/metrics.py, whose names it
    logs, and the readers it imports: helper audit R3)."""
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    graph = package_graph()
    missing = {}
    for name, stage in stages.items():
        deps = [d.rstrip("/") for d in stage.get("deps") or []]
        files = {_module_file(m) for m in stage_closure(ROOT / "stages" / f"{name}.py", graph)}
        lacking = sorted(f for f in files if not any(f == d or f.startswith(d + "/") for d in deps))
        if lacking:
            missing[name] = lacking
    assert not missing, f"dvc.yaml: stages lack deps on modules they import: {missing}"
    assert "kernelcamp.metrics" in stage_closure(ROOT / "stages" / "report.py", graph)  # the walk follows imports
    # and the processes they start: the deploy stage's server runs `python -m kernelcamp.cli serve`, whose cli.py was
    # in no deps of deploy (nor in the server code hash built from them)
    assert {"kernelcamp.cli", "kernelcamp.serve.server"} <= stage_closure(ROOT / "stages" / "deploy.py", graph)
