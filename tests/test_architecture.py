"""The layering rules of DESIGN.md, checked: one-way dependencies (also enforced by import-linter
in ``scripts/test.sh``) and each third-party client used from exactly one adapter module."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGES = ("gpulens", "simulation", "reports", "common", "schemas", "producers", "stream_jobs", "sinks")

# third-party client -> the only modules allowed to import it
ADAPTERS: dict[str, set[str]] = {
    "confluent_kafka": {"common/kafka.py"},
    # the faust adapter is two modules: the app and its transport, and the port the agents use
    "faust": {"stream_jobs/faust_runtime.py", "stream_jobs/faust_port.py"},
    "mode": {"stream_jobs/faust_runtime.py"},
    "aiokafka": {"stream_jobs/faust_runtime.py"},  # the route must place records as faust's producer does
    "clickhouse_connect": {"sinks/clickhouse.py"},
    "chdb": {"sinks/clickhouse.py"},
    "pynvml": {"producers/agent/nvml.py"},
    "grpc": {"producers/agent/fake_kubelet.py"},
    "h2": {"producers/agent/podresources.py"},
    "kubernetes": {"producers/watcher/kube.py"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _source_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in (REPO_ROOT / pkg).rglob("*.py") if "_pb2" not in p.name]


def test_each_third_party_client_lives_in_its_adapter() -> None:
    offenders = []
    for path in _source_files():
        rel = path.relative_to(REPO_ROOT).as_posix()
        for module in _imports(path) & ADAPTERS.keys():
            if rel not in ADAPTERS[module]:
                offenders.append(f"{rel} imports {module}")
    assert offenders == [], "third-party clients outside their adapter modules:\n" + "\n".join(offenders)


def test_parts_never_import_each_other() -> None:
    """The parts import no other part and nothing above them; simulation and reports import
    neither each other nor the CLI (import-linter checks the same, this names the offender)."""
    forbidden = {
        "producers": {"stream_jobs", "sinks", "simulation", "reports", "gpulens"},
        "stream_jobs": {"producers", "sinks", "simulation", "reports", "gpulens"},
        "sinks": {"producers", "stream_jobs", "simulation", "reports", "gpulens"},
        "simulation": {"reports", "gpulens"},
        "reports": {"simulation", "gpulens"},
    }
    offenders = []
    for path in _source_files():
        own = path.relative_to(REPO_ROOT).parts[0]
        for module in _imports(path) & forbidden.get(own, set()):
            offenders.append(f"{path.relative_to(REPO_ROOT)} imports {module}")
    assert offenders == [], "\n".join(offenders)


def test_import_linter_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint)], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_command_modules_never_import_the_cli() -> None:
    """``gpulens.cli`` loads the command modules; importing it back from one would be a cycle."""
    offenders = []
    for path in (REPO_ROOT / "gpulens" / "commands").glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "gpulens.cli" for name in names):
                offenders.append(path.relative_to(REPO_ROOT).as_posix())
    assert offenders == [], "command modules importing gpulens.cli: " + ", ".join(offenders)


def test_every_registered_command_loads() -> None:
    from gpulens.commands import PART_COMMANDS, load_part_command

    for name in PART_COMMANDS:
        assert load_part_command(name).name == name


def test_a_registered_command_its_module_lacks_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulens import commands

    monkeypatch.setitem(commands.PART_COMMANDS, "nosuch", ("sink", "not there"))
    with pytest.raises(ImportError, match="does not define the command 'nosuch'"):
        commands.load_part_command("nosuch")
    monkeypatch.setitem(commands.PART_COMMANDS, "gone", ("no_such_module", "not there"))
    with pytest.raises(ImportError):
        commands.load_part_command("gone")


# --------------------------------------------------------------------------- import cycles
#
# A cycle between two modules stays hidden when one side imports the other inside a function: the
# package imports fine, and import-linter's layers contract sees no upward import when both sides
# are in one layer. So the graph here has every import statement of the product (top-level, inside
# functions, under ``if TYPE_CHECKING:``), module by module, and must have no cycle.


def _module_name(relative: Path) -> str:
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_with_place(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Each import statement with where it runs: ``top``, ``in a function`` or ``type checking``."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(nodes: Iterable[ast.AST], place: str) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append((node, place))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(ast.iter_child_nodes(node), "in a function")
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.body, "type checking" if place == "top" else place)
                visit(node.orelse, place)
            else:
                visit(ast.iter_child_nodes(node), place)

    visit(tree.body, "top")
    return found


def _resolve(name: str, modules: Collection[str]) -> str | None:
    """The product module ``name`` loads: itself, else its nearest enclosing module; None outside the product."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


Edge = tuple[int, str]  # the importing line, where it runs


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, dict[str, Edge]]:
    """Module -> {imported product module: (line, place)} from ``{module: (source, is_package)}``."""
    graph: dict[str, dict[str, Edge]] = {}
    for module, (source, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        edges: dict[str, Edge] = {}
        for node, place in _imports_with_place(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = ".".join(part for part in (base if node.level else "", node.module or "") if part)
                names = [f"{base}.{alias.name}" for alias in node.names]
            for name in names:
                target = _resolve(name, sources)
                if target is not None and target != module and (target not in edges or place == "top"):
                    edges[target] = (node.lineno, place)
        graph[module] = edges
    return graph


def import_cycles(graph: Mapping[str, Mapping[str, Edge]]) -> list[list[str]]:
    """One cycle (its modules in import order) per strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, {})):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group: set[str] = set()
            while (member := stack.pop()) != module:
                group.add(member)
            groups.append(group | {module})

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(_shortest_cycle(min(group), group, graph) for group in groups if len(group) > 1)


def _shortest_cycle(start: str, group: set[str], graph: Mapping[str, Mapping[str, Edge]]) -> list[str]:
    paths = {start: [start]}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(graph[module]):
            if target == start:
                return paths[module]
            if target in group and target not in paths:
                paths[target] = [*paths[module], target]
                queue.append(target)
    raise AssertionError(f"{start} is in no cycle of {sorted(group)}")


def _render(cycle: list[str], graph: Mapping[str, Mapping[str, Edge]]) -> str:
    steps = []
    for module, target in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
        line, place = graph[module][target]
        steps.append(f"  {module} (line {line}, {place}) imports {target}")
    return "\n".join(steps)


def _product_sources() -> dict[str, tuple[str, bool]]:
    return {_module_name(path.relative_to(REPO_ROOT)): (path.read_text(), path.name == "__init__.py")
            for pkg in PACKAGES for path in (REPO_ROOT / pkg).rglob("*.py")}


def test_the_product_has_no_import_cycle() -> None:
    """No two product modules import each other, directly or round a loop, counting the imports
    inside functions and under ``TYPE_CHECKING`` (which hide a cycle from the import system)."""
    graph = import_graph(_product_sources())
    cycles = import_cycles(graph)
    assert cycles == [], "import cycles (move what both sides need into a module below them):\n" + "\n\n".join(
        _render(cycle, graph) for cycle in cycles)


def test_a_cycle_behind_a_function_level_import_is_found() -> None:
    sources = {
        "pkg": ("", True),
        "pkg.low": ("def parse(text):\n    from pkg.high import helper\n    return helper(text)\n", False),
        "pkg.high": ("from pkg import mid\n\ndef helper(text):\n    return text\n", False),
        "pkg.mid": ("from .low import parse\n", False),
        "pkg.leaf": ("import pkg.low\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import leaf2\n",
                     False),
        "pkg.leaf2": ("from pkg.leaf import x\n", False),
    }
    graph = import_graph(sources)
    assert import_cycles(graph) == [["pkg.high", "pkg.mid", "pkg.low"], ["pkg.leaf", "pkg.leaf2"]]
    assert graph["pkg.low"]["pkg.high"] == (2, "in a function")
    assert graph["pkg.leaf"]["pkg.leaf2"] == (4, "type checking")
    assert _render(["pkg.high", "pkg.mid", "pkg.low"], graph).splitlines()[-1] == (
        "  pkg.low (line 2, in a function) imports pkg.high")


MAX_COMPLEXITY = 20
"""The highest cyclomatic complexity (radon) of one function of the product: above it, split it."""


def test_no_function_of_the_product_is_too_complex_to_read() -> None:
    from radon.complexity import cc_visit

    too_complex = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for block in cc_visit(path.read_text(encoding="utf-8")):
                if block.complexity > MAX_COMPLEXITY:
                    too_complex.append(f"{path.relative_to(REPO_ROOT)}:{block.lineno} {block.fullname} "
                                       f"({block.complexity})")
    assert too_complex == [], f"functions above complexity {MAX_COMPLEXITY}:\n" + "\n".join(too_complex)
