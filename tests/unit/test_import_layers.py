"""Imports under sandbox_attest/ flow down the floors of ARCHITECTURE.md, in no circle.

Every import of every module is read from its source with `ast`, including imports inside
functions and under `if TYPE_CHECKING:` (a type-only import still ties the layers together and
tends to become a runtime one). Nothing is imported to find them, so a cycle that only shows
at runtime in one order is found here in every order.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import sandbox_attest
from sandbox_attest.catalog import PROBES

HARNESS = Path(sandbox_attest.__file__).resolve().parent

# The modules that drive a run; nothing below them may import them.
ABOVE = (
    "sandbox_attest.run.runner",
    "sandbox_attest.run.matrix",
    "sandbox_attest.run.session",
    "sandbox_attest.cli",
    "sandbox_attest.plugin",
)
# One catalogue module (or package) per area: the `area` of its specs.
AREAS = frozenset({"net", "dns", "ipc", "fs", "env", "proc", "dev", "lifecycle", "pkg"})
AREAS |= {"syscalls"}  # issue 28: syscalls proc_syscall_surface does not try
AREAS |= {"crossproc", "tunables", "handles"}  # issue 28: processes, tunables, file handles
AREAS |= {"machinery"}  # issue 28: the sandbox's own machinery (helper, descriptors)
AREAS |= {"races"}  # issue 28: paths swapped and sockets bound around setup
# What several areas share lives below them, named by concept.
HELPERS = frozenset({"spec", "attempts", "judging", "controls", "records", "proxyclient"})
HELPERS |= {"canary", "capabilities", "witness", "socket_witness"}
HELPERS |= {"added_targets"}  # issue 26: inside paths the host adds at the rendezvous


@dataclass(frozen=True)
class Edge:
    """One import: `importer` names `imported` at `line`."""

    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        """`sandbox_attest.x (line 3) imports sandbox_attest.y`."""
        return f"{self.importer} (line {self.line}) imports {self.imported}"


def module_name(root: Path, path: Path) -> str:
    """`sandbox_attest.catalog.net.route` for `<root>/catalog/net/route.py`."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(root: Path, dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def edges(root: Path) -> list[Edge]:
    """Every import of our own package by every module under `root`, at any depth."""
    found = []
    for path in sorted(root.rglob("*.py")):
        importer = module_name(root, path)
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [base]
                # `from sandbox_attest.catalog import proc` imports the submodule proc.
                targets += [
                    f"{base}.{a.name}" for a in node.names if _is_module(root, f"{base}.{a.name}")
                ]
            found += [
                Edge(importer, t, node.lineno)
                for t in targets
                if t == root.name or t.startswith(f"{root.name}.")
            ]
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(f"{prefix}.")


def _catalog_part(name: str) -> str | None:
    """`net` for `sandbox_attest.catalog.net.route`; None outside the catalogue or for its root."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "catalog" else None


def violations(root: Path) -> list[str]:
    """Every import under `root` (a `harness` tree) that flows up or sideways, as sentences."""
    found = []
    for edge in edges(root):
        src, dst = edge.importer, edge.imported
        if _within(src, "sandbox_attest.backends") and any(_within(dst, a) for a in ABOVE):
            found.append(f"{edge}: backends must not import the layers that drive a run")
        if _within(src, "sandbox_attest.catalog"):
            if any(_within(dst, a) for a in (*ABOVE, "sandbox_attest.backends")):
                found.append(f"{edge}: the catalogue must not import the runner or backends")
            own, other = _catalog_part(src), _catalog_part(dst)
            if own in HELPERS and other in AREAS:
                found.append(f"{edge}: a shared helper must not import an area module")
            if own in AREAS and other in AREAS and own != other:
                found.append(f"{edge}: one area module must not import another")
    return found


# The floors (ARCHITECTURE.md), lowest first: a module imports only from its own floor or below.
# Keys are packages or modules; a module belongs to the longest key that names it.
FLOORS: dict[str, int] = {
    "sandbox_attest": 0,  # __version__, and nothing else at the root package
    "sandbox_attest.errors": 0,
    "sandbox_attest.paths": 0,
    "sandbox_attest.claims": 1,
    "sandbox_attest.verdict": 1,
    "sandbox_attest.payload": 1,
    "sandbox_attest.host": 2,
    "sandbox_attest.world": 3,
    "sandbox_attest.backends": 4,
    "sandbox_attest.catalog": 4,
    "sandbox_attest.report": 5,
    "sandbox_attest.attest": 6,
    "sandbox_attest.run": 7,
    "sandbox_attest.testing": 8,
    "sandbox_attest.fixtures": 8,
    "sandbox_attest.plugin": 9,
    "sandbox_attest.cli": 9,
}
# Imports left out of the cycle check, each with its reason. Empty: every import counts, the
# ones inside functions too (a lazy import hides a circle from Python, not from a reader).
CYCLE_EXEMPT: dict[tuple[str, str], str] = {}


def room(name: str) -> str:
    """The FLOORS key `name` lives in (its longest prefix there)."""
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        key = ".".join(parts[:n])
        if key in FLOORS:
            return key
    return "sandbox_attest"


def floor_violations(found: list[Edge]) -> list[str]:
    """Every import of a module on a higher floor than the importer's, as sentences."""
    worst: dict[tuple[str, int, str], Edge] = {}
    for edge in found:
        src, dst = room(edge.importer), room(edge.imported)
        if FLOORS[dst] > FLOORS[src]:
            # `from pkg import sub` is two edges (pkg, pkg.sub): name the line once, by sub.
            key = (edge.importer, edge.line, dst)
            if key not in worst or len(edge.imported) > len(worst[key].imported):
                worst[key] = edge
    return [
        f"{edge}: floor {FLOORS[room(edge.importer)]} ({room(edge.importer)}) must not import "
        f"floor {FLOORS[dst]} ({dst})"
        for (_, _, dst), edge in worst.items()
    ]


def module_of(root: Path, dotted: str) -> str:
    """The module `dotted` names, or the nearest module above it (a name inside a module)."""
    while dotted.count(".") and not _is_module(root, dotted):
        dotted = dotted.rpartition(".")[0]
    return dotted


def import_graph(root: Path, found: list[Edge]) -> dict[str, set[str]]:
    """Module -> the modules it imports (names inside a module count as the module)."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        dst = module_of(root, edge.imported)
        if dst != edge.importer and (edge.importer, dst) not in CYCLE_EXEMPT:
            graph.setdefault(edge.importer, set()).add(dst)
    return graph


def cycles(root: Path, found: list[Edge]) -> list[list[str]]:
    """Every circle of imports between modules (strongly connected sets of two or more)."""
    graph = import_graph(root, found)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph is a few hundred nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(members) > 1:
                circles.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def private_imports(root: Path) -> list[str]:
    """Every `from x import _name` of another module's underscore name under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        importer = module_name(root, path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                root.name
            ):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and node.module != importer:
                    found.append(
                        f"{importer} (line {node.lineno}) imports {node.module}.{alias.name}"
                    )
    return found


def catalogue_parts(root: Path) -> set[str]:
    """The names of the modules and packages directly under `<root>/catalog`."""
    catalog = root / "catalog"
    names = {p.stem for p in catalog.glob("*.py") if p.name != "__init__.py"}
    return names | {p.name for p in catalog.iterdir() if (p / "__init__.py").is_file()}


class TestLayers:
    def test_no_import_flows_up_or_sideways(self) -> None:
        """No module under sandbox_attest/ imports a layer above it or a sibling area."""
        assert violations(HARNESS) == []

    def test_imports_flow_down_the_floors(self) -> None:
        """No module imports from a floor above its own (ARCHITECTURE.md's floors)."""
        assert floor_violations(edges(HARNESS)) == []

    def test_no_import_cycles_counting_imports_inside_functions(self) -> None:
        """No circle of imports between modules, lazy imports included."""
        assert cycles(HARNESS, edges(HARNESS)) == []

    def test_no_module_imports_another_modules_private_names(self) -> None:
        """A name with a leading underscore is its module's own; a shared one gets a public name."""
        assert private_imports(HARNESS) == []

    def test_every_module_has_a_floor(self) -> None:
        """A new top-level module or package is placed on a floor before it is used."""
        top = {p.stem for p in HARNESS.glob("*.py") if p.name != "__init__.py"}
        top |= {p.name for p in HARNESS.iterdir() if (p / "__init__.py").is_file()}
        assert {f"sandbox_attest.{t}" for t in top} - set(FLOORS) == set()

    def test_catalogue_is_cut_by_area(self) -> None:
        """Every catalogue module is an area or a shared helper; none collects leftovers."""
        assert catalogue_parts(HARNESS) - AREAS - HELPERS == set()

    @pytest.mark.parametrize("probe", sorted(PROBES))
    def test_spec_lives_in_its_area(self, probe: str) -> None:
        """Each spec is defined in the module (or package) named by its own area."""
        spec = PROBES[probe]
        assert _catalog_part(type(spec).__module__) == spec.area


class TestTheReader:
    def test_finds_function_level_and_from_imports(self, tmp_path: Path) -> None:
        """A lazy import inside a function and a `from pkg import submodule` are both edges."""
        root = tmp_path / "sandbox_attest"
        (root / "catalog").mkdir(parents=True)
        (root / "__init__.py").write_text("")
        (root / "runner.py").write_text("")
        (root / "catalog" / "__init__.py").write_text("from sandbox_attest.catalog import fs\n")
        (root / "catalog" / "fs.py").write_text("")
        (root / "catalog" / "env.py").write_text(
            "def f():\n    from sandbox_attest.run.runner import x\n    from . import fs\n"
        )
        assert sorted(violations(root)) == [
            (
                "sandbox_attest.catalog.env (line 2) imports sandbox_attest.run.runner: "
                "the catalogue must not import the runner or backends"
            ),
            (
                "sandbox_attest.catalog.env (line 3) imports sandbox_attest.catalog.fs: "
                "one area module must not import another"
            ),
        ]
        assert "sandbox_attest.catalog.fs" in {e.imported for e in edges(root)}


class TestTheChecks:
    def test_a_lazy_import_closing_a_circle_is_a_cycle(self, tmp_path: Path) -> None:
        """Module a imports b at the top; b imports a inside a function: one circle of two."""
        root = tmp_path / "sandbox_attest"
        root.mkdir()
        (root / "__init__.py").write_text("")
        (root / "a.py").write_text("from sandbox_attest import b\n")
        (root / "b.py").write_text("def f():\n    from sandbox_attest.a import x\n")
        (root / "c.py").write_text("from sandbox_attest.a import y\n")
        assert cycles(root, edges(root)) == [["sandbox_attest.a", "sandbox_attest.b"]]

    def test_an_upward_import_is_named_with_both_floors(self, tmp_path: Path) -> None:
        """Host (floor 2) importing run (floor 7) is refused; run importing host is fine."""
        root = tmp_path / "sandbox_attest"
        for pkg in ("host", "run"):
            (root / pkg).mkdir(parents=True)
            (root / pkg / "__init__.py").write_text("")
        (root / "__init__.py").write_text("")
        (root / "host" / "users.py").write_text("from sandbox_attest.run import session\n")
        (root / "run" / "session.py").write_text("from sandbox_attest.host import users\n")
        assert floor_violations(edges(root)) == [
            (
                "sandbox_attest.host.users (line 1) imports sandbox_attest.run.session: "
                "floor 2 (sandbox_attest.host) must not import floor 7 (sandbox_attest.run)"
            )
        ]

    def test_a_private_name_from_another_module_is_refused(self, tmp_path: Path) -> None:
        """`from sandbox_attest.a import _x` in b is found; a's own use of _x is not an import."""
        root = tmp_path / "sandbox_attest"
        root.mkdir()
        (root / "__init__.py").write_text("")
        (root / "a.py").write_text("_x = 1\n")
        (root / "b.py").write_text("from sandbox_attest.a import _x, y\n")
        assert private_imports(root) == ["sandbox_attest.b (line 1) imports sandbox_attest.a._x"]
