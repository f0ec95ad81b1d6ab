"""Setting up one run: the ONE place a run starts, for `sandbox-attest run` and the plugin alike.

A run's set-up, in this order: its inputs are checked (`check_inputs`, before any fixture
starts, so a typo is one clear line); the payload user is chosen (`use_payload_user`, before
anything looks it up); the lab is entered, then the signer started, then the run id and the
report directory named (`start_run`). `sandbox-attest run` does these itself before pytest
(so a bad key stops it first, and the key leaves the environment before pytest loads any
plugin) and hands the signer over; the plugin then opens the session the same way
(`open_session`), with the signer handed over or one it starts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_attest.errors import ConfigError
from sandbox_attest.host.trust import USER_ENV
from sandbox_attest.paths import default_policy
from sandbox_attest.run.matrix import BackendRow, Matrix, current_platform, load_matrix
from sandbox_attest.run.session import RunSession, new_run_id
from sandbox_attest.world.lab import WorldMode, ensure_lab

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox_attest.attest.signer import Signer


def with_spec_backends(
    matrix: Matrix, chosen: list[str], spec_files: list[str]
) -> tuple[Matrix, list[str]]:
    """Add command-wrapper specs to the matrix and to the chosen backends.

    A spec comes from `--backend-spec FILE`, or from a chosen name without a matrix row that
    names `matrix/backends/<name>.toml`. Each gets a row for the platforms it declares.

    Returns:
        The matrix with the specs' rows, and the chosen names with the specs' names added.
    """
    from sandbox_attest.backends import register_spec  # noqa: PLC0415
    from sandbox_attest.backends.command.spec_load import load_spec, resolve_spec  # noqa: PLC0415

    known = {row.name for row in matrix.backends}
    files = [
        *spec_files,
        *(
            str(path)
            for name in chosen
            if name not in known and (path := resolve_spec(name)) is not None
        ),
    ]
    rows = list(matrix.backends)
    names: list[str] = []
    for spec_file in files:
        spec = load_spec(Path(spec_file))
        register_spec(Path(spec_file))
        names.append(spec.name)
        if all(row.name != spec.name for row in rows):
            reason = f"{spec.name} ({spec_file}) is declared for {', '.join(spec.platforms)}"
            rows.append(BackendRow(spec.name, spec.platforms, reason))
    matrix = dataclasses.replace(matrix, backends=tuple(rows))
    return matrix, [*chosen, *(n for n in names if n not in chosen)]


def check_inputs(matrix: Path, policy: Path, backends: list[str], specs: list[str]) -> None:
    """Check the inputs before any fixture starts, so a typo is one clear line, not a trace.

    Raises:
        HarnessError: the matrix, the policy, a spec or a backend name is wrong (the message
            names the file or the name and the fix).
    """
    from sandbox_attest.backends.command.spec_load import (  # noqa: PLC0415
        available_specs,
        resolve_spec,
        specs_dir,
    )
    from sandbox_attest.report.policy import load_policy  # noqa: PLC0415
    from sandbox_attest.run.matrix import load_matrix  # noqa: PLC0415
    from sandbox_attest.run.requirements import check_names  # noqa: PLC0415

    loaded, chosen = with_spec_backends(load_matrix(matrix), list(backends), list(specs))
    check_names(loaded, load_policy(policy))
    known = [row.name for row in loaded.backends]
    for name in chosen:
        if name not in known and resolve_spec(name) is None:
            raise ConfigError(
                f"unknown backend {name!r}: not a [[backend]] of {matrix} "
                f"({', '.join(known)}) nor a spec in {specs_dir()} "
                f"({', '.join(available_specs()) or 'none'}); put {name}.toml there or pass "
                "--backend-spec FILE"
            )


def check_payload_user() -> None:
    """Check that the payload user reaches what every backend runs and binds, before any cell.

    One line and exit 2 here (the path, why, the fix), never an ERROR in every cell; the
    session asks again and gets this same answer (sandbox_attest/run/reach.py).

    Raises:
        ConfigError: no interpreter the payload user can run, or a directory it cannot enter.
    """
    from sandbox_attest.host.trust import payload_user  # noqa: PLC0415
    from sandbox_attest.run.reach import preflight  # noqa: PLC0415

    preflight(payload_user())


def use_payload_user(name: str | None) -> None:
    """Run the payloads as account `name` (None: the default or $SANDBOX_ATTEST_PAYLOAD_USER).

    Before the signer starts (it checks that this user cannot read the key) and before any
    payload user is looked up: host/trust.py reads the variable on each lookup.
    """
    if name:
        os.environ[USER_ENV] = name


def start_signer(key: Path | None) -> Signer:
    """Start the signer process with the signing key now, so a bad key stops the run first.

    The key `finish` signs with: --key, else $SANDBOX_ATTEST_SIGNING_KEY (removed from this
    process's environment right here, before pytest or any cell starts), else the
    per-machine one. The signer holds it from then on; nothing else of the harness does.

    Returns:
        The started signer; the caller closes it (it is a context manager).

    Raises:
        ConfigError: the key cannot be read, the payload uid could read it, it is encrypted,
            or it is not Ed25519.
        ReportError: the signer process did not start.
    """
    from sandbox_attest.attest.signer import Signer  # noqa: PLC0415

    return Signer.start(key, os.environ)


@dataclass(frozen=True)
class RunStart:
    """What every run starts with: its signer, its run id and its report directory."""

    signer: Signer
    run_id: str
    report_dir: Path


def start_run(
    *,
    world: WorldMode,
    key: Path | None,
    signer_for: Callable[[Path | None], Signer],
    run_id: str | None = None,
    report_dir: str | None = None,
) -> RunStart:
    """Enter the lab, start the signer, and name the run and its report directory.

    Args:
        world: where the fixture hosts live: auto, lab or loopback.
        key: the release key's path (None: $SANDBOX_ATTEST_SIGNING_KEY or the per-machine key).
        signer_for: how the signer is had for `key` (`start_signer`, or one handed over).
        run_id: the run's id (None: a new one).
        report_dir: the report directory (None: reports/<run id>).
    """
    # The lab first (namespaces are entered per thread: nothing may have started yet, and
    # the signer's reader thread and every child must be born inside it), then the signer,
    # before anything else of the run: it takes the key (and the variable out of
    # os.environ) before any backend is even asked, and a bad key stops the run in one
    # line instead of being found after every cell ran.
    ensure_lab(world)
    signer = signer_for(key)
    # One run id everywhere: the directory name and every file inside (evidence, JUnit,
    # Allure, the pages, the attestation) carry the same one.
    run_id = run_id or new_run_id()
    return RunStart(signer, run_id, Path(report_dir) if report_dir else Path("reports") / run_id)


@dataclass(frozen=True)
class RunOptions:
    """A matrix run as the plugin's options ask for it (see sandbox_attest/plugin/).

    Attributes:
        matrix: the matrix file collected.
        backends: the backends named (none: every backend of this platform).
        specs: command-wrapper spec files to attest as well.
        required: backends whose every cell is required (--require-backend).
        report_dir: the report directory (None: reports/<run id>).
        policy: the release policy file (None: the installed package's).
        key: the release key file (None: the variable or the per-machine key).
        jobs: cells to run at once.
        world: where the fixture hosts live: auto, lab or loopback.
        run_id: the run's id (None: a new one).
    """

    matrix: Path
    backends: list[str]
    specs: list[str]
    required: list[str]
    report_dir: str | None
    policy: str | None
    key: str | None
    jobs: int
    world: WorldMode
    run_id: str | None


def open_session(options: RunOptions, signer_for: Callable[[Path | None], Signer]) -> RunSession:
    """The run's session: its backends chosen, then the lab, the signer, the id and directory.

    Args:
        options: what the run was asked for.
        signer_for: how the signer is had (the plugin's: one handed over, else one started).
    """
    matrix = load_matrix(options.matrix)
    platform = current_platform()
    chosen = options.backends or [row.name for row in matrix.backends if platform in row.platforms]
    # Backends named on purpose (a backend or a spec option) are attested on purpose:
    # an escape there fails the run. Default-included ones are held to the policy only.
    named = set(options.backends)
    before = set(chosen)
    matrix, chosen = with_spec_backends(matrix, chosen, options.specs)
    named |= set(chosen) - before  # the spec files
    key = Path(options.key) if options.key else None
    start = start_run(
        world=options.world,
        key=key,
        signer_for=signer_for,
        run_id=options.run_id,
        report_dir=options.report_dir,
    )
    session = RunSession(
        matrix=matrix,
        backend_names=list(chosen),
        # A fresh directory per run: the journal is created O_EXCL, so a report directory
        # is never shared by two runs.
        report_dir=start.report_dir,
        run_id=start.run_id,
        policy_path=Path(options.policy) if options.policy else default_policy(),
        required_backends=set(options.required),
        named_backends=named - {matrix.control},
        key_path=key,
        jobs=max(1, int(options.jobs)),
    )
    session.use_signer(start.signer)
    return session
