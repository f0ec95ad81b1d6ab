"""Imports under sandbox_attest/ flow down: backends and the catalogue sit below the runner.

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


def catalogue_parts(root: Path) -> set[str]:
    """The names of the modules and packages directly under `<root>/catalog`."""
    catalog = root / "catalog"
    names = {p.stem for p in catalog.glob("*.py") if p.name != "__init__.py"}
    return names | {p.name for p in catalog.iterdir() if (p / "__init__.py").is_file()}


class TestLayers:
    def test_no_import_flows_up_or_sideways(self) -> None:
        """No module under sandbox_attest/ imports a layer above it or a sibling area."""
        assert violations(HARNESS) == []

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
