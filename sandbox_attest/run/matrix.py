"""Load matrix/matrix.toml into typed rows; reject anything unknown with file, key and fix."""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_attest.errors import ConfigError
from sandbox_attest.host import platform as host_os

# Callers ask the matrix which platform it judges; the answer lives below both the matrix and
# the backends (sandbox_attest/host/platform.py), so that neither has to import the other.
current_platform = host_os.current_platform

PROBE_KEYS = {"id", "timeout", "platforms", "reason"}
BACKEND_KEYS = {"name", "platforms", "reason", "demonstration"}
EXCLUDE_KEYS = {"backend", "probe", "reason"}
TOP_KEYS = {"matrix", "probe", "backend", "exclude"}
MATRIX_KEYS = {"control"}
KNOWN_PLATFORMS = {"linux", "darwin", "windows"}


@dataclass(frozen=True)
class ProbeRow:
    """A probe column of the matrix."""

    id: str
    timeout: float
    platforms: tuple[str, ...] = ("linux", "darwin", "windows")
    reason: str = ""  # why the probe does not apply on the other platforms


@dataclass(frozen=True)
class BackendRow:
    """A backend row: the platforms it exists on and why not elsewhere."""

    name: str
    platforms: tuple[str, ...]
    reason: str
    # Why the backend is in the default set although it is expected not to PASS (it shows
    # what a verdict looks like); the grid and the evidence print it beside its column.
    demonstration: str = ""


@dataclass(frozen=True)
class Cell:
    """One (backend, probe) cell and, if it does not run here, the written reason."""

    backend: str
    probe: ProbeRow
    not_applicable: str | None

    @property
    def cell_id(self) -> str:
        """`<backend>-<probe>`, the stable id used in pytest, allure and the attestation."""
        return f"{self.backend}-{self.probe.id}"


@dataclass(frozen=True)
class Matrix:
    """The loaded matrix file."""

    path: Path
    digest: str
    control: str
    probes: tuple[ProbeRow, ...]
    backends: tuple[BackendRow, ...]
    exclusions: dict[tuple[str, str], str]

    def backend(self, name: str) -> BackendRow:
        """The row of backend `name`, or a ConfigError listing the known names."""
        for row in self.backends:
            if row.name == name:
                return row
        known = ", ".join(r.name for r in self.backends)
        raise ConfigError(f"{self.path}: no backend named {name!r}; known backends: {known}")

    def cells(self, backends: list[str], platform: str) -> list[Cell]:
        """The cells for `backends` on `platform`, control leg first, in matrix order."""
        order = [self.control] + [b for b in backends if b != self.control]
        cells = []
        for name in order:
            row = self.backend(name)
            cells += [
                Cell(name, p, self.not_applicable(row, name, p, platform)) for p in self.probes
            ]
        return cells

    def not_applicable(
        self, row: BackendRow | None, backend: str, probe: ProbeRow, platform: str
    ) -> str | None:
        """Why the matrix does not run `probe` on `backend` here, or None: the one rule.

        `row` is the backend's matrix row, or None for a backend the matrix does not list (a
        vendor's spec handed to the pytest fixtures), which then has no platform row to check.
        """
        if row is not None and platform not in row.platforms:
            return row.reason or f"{backend} does not run on {platform}"
        if platform not in probe.platforms:
            return probe.reason or f"{probe.id} does not apply on {platform}"
        return self.exclusions.get((backend, probe.id))


def _check_keys(path: Path, where: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{path}, {where}: unknown key(s) {unknown}; allowed keys are {sorted(allowed)}"
        )


def _load_probes(path: Path, tables: list[dict[str, Any]]) -> list[ProbeRow]:
    probes = []
    for i, row in enumerate(tables):
        _check_keys(path, f"[[probe]] #{i + 1}", row, PROBE_KEYS)
        if "id" not in row:
            raise ConfigError(f"{path}, [[probe]] #{i + 1}: missing 'id'; name the probe")
        timeout = row.get("timeout", 60)
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(
                f"{path}, probe {row['id']!r}: timeout = {timeout!r} "
                "is not a positive number of seconds"
            )
        platforms = tuple(row.get("platforms", ProbeRow.platforms))
        bad = sorted(set(platforms) - KNOWN_PLATFORMS)
        if bad or not platforms:
            raise ConfigError(
                f"{path}, probe {row['id']!r}: platforms {list(platforms)} must be "
                f"a non-empty list from {sorted(KNOWN_PLATFORMS)}"
            )
        if set(platforms) != KNOWN_PLATFORMS and not str(row.get("reason", "")).strip():
            raise ConfigError(
                f"{path}, probe {row['id']!r}: applies only to {list(platforms)}; "
                "add a 'reason' saying why it does not apply elsewhere"
            )
        probes.append(
            ProbeRow(str(row["id"]), float(timeout), platforms, str(row.get("reason", "")))
        )
    return probes


def _load_backends(path: Path, tables: list[dict[str, Any]]) -> list[BackendRow]:
    backends = []
    for i, row in enumerate(tables):
        _check_keys(path, f"[[backend]] #{i + 1}", row, BACKEND_KEYS)
        platforms = tuple(row.get("platforms", []))
        bad = sorted(set(platforms) - KNOWN_PLATFORMS)
        if "name" not in row or not platforms or bad:
            raise ConfigError(
                f"{path}, [[backend]] #{i + 1}: needs 'name' and 'platforms' "
                f"from {sorted(KNOWN_PLATFORMS)} (got unknown {bad})"
            )
        backends.append(
            BackendRow(
                str(row["name"]),
                platforms,
                str(row.get("reason", "")),
                " ".join(str(row.get("demonstration", "")).split()),
            )
        )
    return backends


def _load_exclusions(
    path: Path, tables: list[dict[str, Any]], probes: list[ProbeRow], backends: list[BackendRow]
) -> dict[tuple[str, str], str]:
    """The [[exclude]] tables; each must name a backend row and a probe of this matrix.

    An exclusion naming something that is not here would silently exclude nothing, so the
    reader of the matrix would believe in a decision that never took effect.
    """
    probe_ids = [p.id for p in probes]
    backend_names = [b.name for b in backends]
    exclusions: dict[tuple[str, str], str] = {}
    for i, row in enumerate(tables):
        where = f"{path}, [[exclude]] #{i + 1}"
        _check_keys(path, f"[[exclude]] #{i + 1}", row, EXCLUDE_KEYS)
        if not str(row.get("reason", "")).strip():
            raise ConfigError(f"{where}: every exclusion needs a written 'reason'")
        for key, known in (("backend", backend_names), ("probe", probe_ids)):
            if key not in row:
                raise ConfigError(f"{where}: missing '{key}'; name the {key} it excludes")
            if str(row[key]) not in known:
                raise ConfigError(
                    f"{where}: {key} = {str(row[key])!r} is not in this matrix, so the "
                    f"exclusion would exclude nothing; known: {', '.join(known)}"
                )
        exclusions[(str(row["backend"]), str(row["probe"]))] = str(row["reason"])
    return exclusions


def _declared_open(name: str) -> str | None:
    """Why backend `name` cannot be the control leg, or None when it declares nothing closed.

    The control leg proves each probe can see its escape; a control that confines anything
    would make a probe look blind (INCONCLUSIVE) or, worse, make a sandbox's denial look like
    the expected outcome. Only declared claims with network, filesystem and ipc all "open"
    qualifies: the built-in `none`, or a command-wrapper spec that declares exactly that.
    """
    from sandbox_attest.backends import create_backend  # noqa: PLC0415  (matrix stays import-light)
    from sandbox_attest.backends.command.backend import CommandBackend  # noqa: PLC0415
    from sandbox_attest.backends.none import CLAIMS as NONE_CLAIMS  # noqa: PLC0415

    if name == "none":
        declared = NONE_CLAIMS
    else:
        backend = create_backend(name)
        if not isinstance(backend, CommandBackend):
            return f"{name} is a built-in sandbox and confines by design"
        declared = backend.spec.claims
    closed = {k: v for k, v in declared.as_dict().items() if k != "limits" and v != "open"}
    if closed:
        return f"{name} declares {', '.join(f'{k}={v}' for k, v in sorted(closed.items()))}"
    return None


def _load_control(path: Path, table: object, backends: list[BackendRow]) -> str:
    """The `[matrix] control` backend: a row of this matrix that declares no confinement."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [matrix] must be a table")
    _check_keys(path, "[matrix]", table, MATRIX_KEYS)
    control = table.get("control", "none")
    names = [b.name for b in backends]
    if not isinstance(control, str) or control not in names:
        raise ConfigError(
            f"{path}, [matrix] control = {control!r}: not a [[backend]] of this matrix; "
            f"name one of {', '.join(names)} (the control leg is normally 'none')"
        )
    why = _declared_open(control)
    if why is not None:
        raise ConfigError(
            f"{path}, [matrix] control = {control!r}: the control leg must declare network, "
            f"filesystem and ipc all 'open' (it proves each probe can see its escape), but "
            f"{why}; use control = 'none'"
        )
    return control


def load_matrix(path: Path) -> Matrix:
    """Parse and validate a matrix file.

    Raises:
        ConfigError: naming the file, the entry and the fix, for any malformed content.
    """
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: matrix file not found; pass --matrix FILE") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax there") from exc
    _check_keys(path, "top level", data, TOP_KEYS)
    probes = _load_probes(path, data.get("probe", []))
    backends = _load_backends(path, data.get("backend", []))
    if not probes or not backends:
        raise ConfigError(
            f"{path}: the matrix has no probes or no backends; an empty matrix "
            "can never attest anything"
        )
    ids = [p.id for p in probes]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: a probe is listed twice in {ids}")
    exclusions = _load_exclusions(path, data.get("exclude", []), probes, backends)
    control = _load_control(path, data.get("matrix", {}), backends)
    return Matrix(
        path, hashlib.sha256(raw).hexdigest(), control, tuple(probes), tuple(backends), exclusions
    )
