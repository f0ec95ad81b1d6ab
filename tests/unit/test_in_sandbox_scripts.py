"""The scripts that run inside sandboxes keep their contract: stdlib only, Python 3.8+.

They run on whatever interpreter the sandbox offers, alone, without the harness (shim.py,
pipe_shim.py, probes/*.py). No 3.8 interpreter exists on this machine, so this checks what can
be checked statically: 3.8 grammar, stdlib-only imports, no annotation that a 3.8 interpreter
would evaluate and reject (builtin generics or `X | Y` outside `from __future__ import
annotations`), and none of the newer standard-library names we have slipped on before.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_attest.paths import probes_dir
from tests.py38 import python38

EGRESS = Path(__file__).resolve().parents[2] / "sandbox_attest" / "world" / "egress"
SCRIPTS = sorted([EGRESS / "shim.py", EGRESS / "pipe_shim.py", *probes_dir().glob("*.py")])
BUILTIN_GENERICS = frozenset({"list", "dict", "tuple", "set", "frozenset", "type"})
# Attribute names that exist only on Python >= 3.9 (str, socket, random, math, pathlib,
# functools, int, itertools). Deliberately short: the ones a 3.11 habit writes without noticing.
NEWER_NAMES = frozenset(
    {
        "removeprefix",  # str, 3.9
        "removesuffix",  # str, 3.9
        "send_fds",  # socket, 3.9
        "recv_fds",  # socket, 3.9
        "randbytes",  # random, 3.9
        "lcm",  # math, 3.9
        "is_relative_to",  # pathlib, 3.9
        "with_stem",  # pathlib, 3.9
        "cache",  # functools, 3.9
        "bit_count",  # int, 3.10
        "pairwise",  # itertools, 3.10
    }
)


def _evaluated_annotations(tree: ast.Module) -> list[ast.expr]:
    """Annotations a 3.8 interpreter evaluates: function signatures, module and class level."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            found += [a.annotation for a in every if a is not None and a.annotation is not None]
            if node.returns is not None:
                found.append(node.returns)
    scopes: list[ast.Module | ast.ClassDef] = [tree]
    scopes += [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for scope in scopes:
        found += [s.annotation for s in scope.body if isinstance(s, ast.AnnAssign)]
    return found


def _too_new_for_38(annotation: ast.expr) -> bool:
    for node in ast.walk(annotation):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return True
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in BUILTIN_GENERICS
        ):
            return True
    return False


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_parses_as_python_38(script: Path) -> None:
    """The grammar of 3.8 (no match, no parenthesised context managers, ...)."""
    ast.parse(script.read_text(encoding="utf-8"), feature_version=(3, 8))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_imports_only_the_standard_library(script: Path) -> None:
    """Nothing from the harness or site-packages: the script is alone in the sandbox."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import in {script.name}"
            assert node.module is not None
            modules.add(node.module.split(".")[0])
    assert modules, f"{script.name} imports nothing?"
    outside = sorted(m for m in modules if m not in sys.stdlib_module_names)
    assert outside == [], f"{script.name} imports {outside}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_annotation_a_38_interpreter_would_reject(script: Path) -> None:
    """`list[str]` or `int | None` in an evaluated annotation is a TypeError on 3.8."""
    source = script.read_text(encoding="utf-8")
    if "from __future__ import annotations" in source:
        return  # annotations are strings, never evaluated
    bad = [ast.unparse(a) for a in _evaluated_annotations(ast.parse(source)) if _too_new_for_38(a)]
    assert bad == [], f"{script.name}: {bad}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_standard_library_name_newer_than_38(script: Path) -> None:
    """None of the known 3.9+ names, used as an attribute or imported by name."""
    used: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used |= {alias.name for alias in node.names}
    assert sorted(used & NEWER_NAMES) == [], script.name


def test_the_checks_catch_what_they_name() -> None:
    """Each check rejects a sample of what it is there for (so none passes vacuously)."""
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 8))
    sample = ast.parse("def f(a: list[str]) -> int | None: ...\nX: dict[str, int] = {}\n")
    assert [ast.unparse(a) for a in _evaluated_annotations(sample) if _too_new_for_38(a)] == [
        "list[str]",
        "int | None",
        "dict[str, int]",
    ]
    local_only = ast.parse("def f():\n    y: list[int] = []\n")
    assert [a for a in _evaluated_annotations(local_only) if _too_new_for_38(a)] == []


def test_compiles_on_a_real_python_38() -> None:
    """Every in-sandbox script compiles on a 3.8 interpreter, where this machine has one."""
    code = "import sys\nfor p in sys.argv[1:]:\n    compile(open(p, 'rb').read(), p, 'exec')\n"
    result = subprocess.run(
        [python38(), "-c", code, *map(str, SCRIPTS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "script", [EGRESS / "shim.py", EGRESS / "pipe_shim.py"], ids=lambda p: p.name
)
def test_shims_start_on_a_real_python_38(script: Path) -> None:
    """Their module code runs on 3.8 (annotations, imports): `--help` executes all of it."""
    result = subprocess.run(
        [python38(), str(script), "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")
