"""pytest plugin: collects a matrix file as one test per cell, when asked to. Wiring only.

Installing sandbox-attest loads this module into every pytest run on the machine (the
`pytest11` entry point), so it waits to be asked: a matrix is collected only with
`pytest --sandbox-attest [MATRIX]`, a `sandbox_attest_matrix` ini option, or through
`sandbox-attest run`, never because some project has a file named `matrix.toml`. Every
option it adds starts with `--sandbox-attest`; the fixtures a vendor's own tests use live in
sandbox_attest.testing, registered from here.

Decisions live in run.setup (a run's start), run.session (its lifetime) and run.runner (one cell).
This module maps them onto pytest: options, collection, a verdict word per item, the grid at the
end, and the run's finish, which renders junit.xml, allure-results/ and the pages from the judged
evidence.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from sandbox_attest.verdict import Verdict

if TYPE_CHECKING:
    from sandbox_attest.attest.signer import Signer
    from sandbox_attest.report.evidence import CellEntry
    from sandbox_attest.run.matrix import Cell

    # The session pulls in the world, the backends and the catalog; the plugin is loaded into
    # every pytest run (the self-tests too), so it imports them only when a matrix is collected.
    from sandbox_attest.run.session import RunSession

HELP_ATTEST = (
    "collect this matrix file as one test per cell (default without a value: the installed "
    "package's matrix.toml); write --sandbox-attest=FILE when test paths follow. Without "
    "test paths only the matrix runs"
)
HELP_INI_MATRIX = (
    "matrix file (relative to this ini file) collected as one test per cell, as if "
    "--sandbox-attest=FILE were given"
)
HELP_BACKEND = "backend to attest (repeatable); default: every backend of this platform"
HELP_REQUIRE = "backend that must be available: UNAVAILABLE fails instead of skipping (repeat)"
HELP_REPORT_DIR = "directory for evidence.json, the attestation and the HTML report"
HELP_POLICY = "release policy TOML (default: the installed package's policy.toml)"
HELP_KEY = "Ed25519 private key (PEM) to sign the attestation with"
HELP_JOBS = "cells to run at once in a pool (control leg first, then the rest)"
HELP_SPEC = "command-wrapper backend spec TOML to attest as well (repeatable)"
HELP_RUN_ID = "the run id (default: a new one); the default report directory is reports/<run id>"
HELP_WORLD = "auto (the lab where it can be made), lab (required) or loopback (default: auto)"
HELP_PAYLOAD_USER = (
    "the account sandboxed commands run as, when the harness runs as root (default: agent, "
    "created on first use; also $SANDBOX_ATTEST_PAYLOAD_USER). A wrapper can read its name: "
    "pick one that does not say it is a test"
)

# Every option of the plugin carries this prefix: it is loaded into every pytest run of a
# machine that has the package, so a short name (--backend-spec) could clash with another
# plugin's or a project's own conftest option.
PREFIX = "--sandbox-attest"
OPT_MATRIX = PREFIX
OPT_BACKEND = f"{PREFIX}-backend"
OPT_REQUIRE = f"{PREFIX}-require-backend"
OPT_REPORT_DIR = f"{PREFIX}-report-dir"
OPT_POLICY = f"{PREFIX}-policy"
OPT_KEY = f"{PREFIX}-key"
OPT_JOBS = f"{PREFIX}-jobs"
OPT_SPEC = f"{PREFIX}-backend-spec"
OPT_RUN_ID = f"{PREFIX}-run-id"
OPT_WORLD = f"{PREFIX}-world"
OPT_PAYLOAD_USER = f"{PREFIX}-payload-user"
OPT_FAIL_ON = f"{PREFIX}-fail-on"
HELP_FAIL_ON = (
    "failed (default): a cell nothing required that did not PASS is reported as 'warned' "
    "and the run exits 0 if the gate holds; warned: such a cell fails like a required one"
)
INI_MATRIX = "sandbox_attest_matrix"
# The value of a bare `--sandbox-attest`: the installed package's own matrix.
DEFAULT_MATRIX = "<default>"

SESSION_KEY = pytest.StashKey["RunSession"]()
SIGNER_KEY = pytest.StashKey["Signer"]()
OWNS_SIGNER_KEY = pytest.StashKey[bool]()  # this plugin started the signer, so it closes it
INTERRUPTED_KEY = pytest.StashKey[bool]()
PYTEST_SESSION_KEY = pytest.StashKey[pytest.Session]()
MATRIX_PATH_KEY = pytest.StashKey["Path | None"]()  # the matrix this run was asked to collect
# Set by `sandbox-attest run`, which prints the gate lines itself: the summary then leaves
# them out, so nothing is printed twice (issue 29).
GATE_BY_CLI_KEY = pytest.StashKey[bool]()
# pytest's stats key (and the word in its last line) for a cell nothing required that did
# not PASS: "3 passed, 1 warned", never a red "1 failed" above `gate: WARNED` and exit 0.
WARNED = "warned"


class CellFailed(Exception):  # noqa: N818  (pytest shows the class name; this one reads well)
    """A cell whose verdict is not PASS (and not an excused skip)."""

    def __init__(self, entry: CellEntry) -> None:
        """Keep the evidence entry for the failure report."""
        super().__init__(f"{entry['verdict']}: {entry['reason']}")
        self.entry = entry


def pytest_addoption(parser: pytest.Parser) -> None:
    """Options of the matrix run, every one prefixed `--sandbox-attest`."""
    group = parser.getgroup("sandbox-attest")
    group.addoption(
        OPT_MATRIX,
        nargs="?",
        const=DEFAULT_MATRIX,
        default=None,
        metavar="MATRIX",
        help=HELP_ATTEST,
    )
    group.addoption(OPT_BACKEND, action="append", default=[], metavar="NAME", help=HELP_BACKEND)
    group.addoption(OPT_REQUIRE, action="append", default=[], metavar="NAME", help=HELP_REQUIRE)
    group.addoption(OPT_REPORT_DIR, default=None, metavar="DIR", help=HELP_REPORT_DIR)
    group.addoption(OPT_POLICY, default=None, metavar="FILE", help=HELP_POLICY)
    group.addoption(OPT_KEY, default=None, metavar="PEM", help=HELP_KEY)
    group.addoption(OPT_JOBS, type=int, default=1, metavar="N", help=HELP_JOBS)
    group.addoption(OPT_SPEC, action="append", default=[], metavar="FILE", help=HELP_SPEC)
    group.addoption(OPT_RUN_ID, default=None, metavar="ID", help=HELP_RUN_ID)
    group.addoption(OPT_WORLD, choices=("auto", "lab", "loopback"), default="auto", help=HELP_WORLD)
    group.addoption(OPT_PAYLOAD_USER, default=None, metavar="NAME", help=HELP_PAYLOAD_USER)
    group.addoption(OPT_FAIL_ON, choices=("failed", "warned"), default="failed", help=HELP_FAIL_ON)
    parser.addini(INI_MATRIX, HELP_INI_MATRIX, default="")


def chosen_matrix(config: pytest.Config) -> Path | None:
    """The matrix file this pytest run was asked to collect, or None: then nothing is.

    `--sandbox-attest[=FILE]` wins over the `sandbox_attest_matrix` ini option; a bare
    `--sandbox-attest` means the installed package's matrix (sandbox_attest.paths.default_matrix).
    """
    given = config.getoption(OPT_MATRIX, None)
    if given == DEFAULT_MATRIX:
        from sandbox_attest.paths import default_matrix  # noqa: PLC0415

        return default_matrix().resolve()
    if given:
        return Path(given).resolve()
    ini = str(config.getini(INI_MATRIX) or "").strip()
    if not ini:
        return None
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return (base / ini).resolve()


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker and the fixtures; put the asked-for matrix among the test paths."""
    config.addinivalue_line("markers", "cell(backend, probe): a matrix cell of sandbox-attest.")
    config.pluginmanager.import_plugin("sandbox_attest.testing")
    matrix = chosen_matrix(config)
    config.stash[MATRIX_PATH_KEY] = matrix
    if matrix is None:
        return
    # Without test paths on the command line, `pytest --sandbox-attest` runs the matrix alone
    # (not the project's testpaths as well); with them, the matrix joins them unless one
    # already holds it. The ini option alone keeps the project's own paths and adds the matrix.
    named = config.args_source == pytest.Config.ArgsSource.ARGS
    if config.getoption(OPT_MATRIX, None) and not named:
        config.args = [str(matrix)]
    elif not any(matrix.is_relative_to(Path(arg.split("::")[0]).resolve()) for arg in config.args):
        config.args = [*config.args, str(matrix)]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Collect the matrix file this run was asked for, and no other file."""
    matrix = parent.config.stash.get(MATRIX_PATH_KEY, None)
    if matrix is None or file_path.resolve() != matrix:
        return None
    # The id a person reads: `matrix.toml::none-net_denied_host`, relative to the rootdir
    # when the file is inside it, else its bare name (never `../venv/lib/.../site-packages`).
    try:
        nodeid = file_path.resolve().relative_to(parent.config.rootpath.resolve()).as_posix()
    except ValueError:
        nodeid = file_path.name
    return MatrixFile.from_parent(parent, path=file_path, nodeid=nodeid)


def _hide_the_harness(config: pytest.Config) -> None:
    """Before any payload user is looked up or wrapper started: what a wrapper may see.

    The payload user named by the option goes where sandbox_attest/host/trust.py reads it, and
    this process (every wrapper's parent) shows a neutral title, unless the CLI set one
    already (sandbox_attest/host/proctitle.py, issue 23).
    """
    from sandbox_attest.host.proctitle import harness_title, retitled, set_title  # noqa: PLC0415
    from sandbox_attest.run.setup import use_payload_user  # noqa: PLC0415

    use_payload_user(config.getoption(OPT_PAYLOAD_USER))
    if not retitled():
        set_title(harness_title())


def _session(config: pytest.Config, matrix_path: Path) -> RunSession:
    """The run of this pytest session, set up (sandbox_attest/run/setup.py) on first use."""
    if SESSION_KEY not in config.stash:
        from sandbox_attest.host.lifetime import catch_run_signals  # noqa: PLC0415
        from sandbox_attest.run.setup import RunOptions, open_session  # noqa: PLC0415

        # SIGTERM and SIGHUP end a matrix run as Ctrl-C does (host/lifetime.py): the cell
        # in flight becomes ERROR and the report is still written and signed, as incomplete.
        # Installed here, not in pytest_configure: the self-tests keep pytest's own handling.
        catch_run_signals()
        _hide_the_harness(config)
        options = RunOptions(
            matrix=matrix_path,
            backends=list(config.getoption(OPT_BACKEND)),
            specs=list(config.getoption(OPT_SPEC)),
            required=list(config.getoption(OPT_REQUIRE)),
            report_dir=config.getoption(OPT_REPORT_DIR),
            policy=config.getoption(OPT_POLICY),
            key=config.getoption(OPT_KEY),
            jobs=int(config.getoption(OPT_JOBS)),
            world=config.getoption(OPT_WORLD),
            run_id=config.getoption(OPT_RUN_ID),
        )
        config.stash[SESSION_KEY] = open_session(options, lambda key: _signer(config, key))
    return config.stash[SESSION_KEY]


def _signer(config: pytest.Config, key_path: Path | None) -> Signer:
    """The run's signer: the one `sandbox-attest run` handed over, else one started now."""
    if SIGNER_KEY not in config.stash:
        from sandbox_attest.run.setup import start_signer  # noqa: PLC0415

        config.stash[SIGNER_KEY] = start_signer(key_path)
        config.stash[OWNS_SIGNER_KEY] = True
    return config.stash[SIGNER_KEY]


class SignerHandoff:
    """A plugin object that hands a signer started before pytest to the matrix run.

    `sandbox-attest run` starts the signer before pytest (so the key leaves the environment
    before pytest loads any plugin) and registers one of these; it stays the CLI's to close.
    """

    def __init__(self, signer: Signer) -> None:
        """Keep the signer until pytest is configured."""
        self.signer = signer

    def pytest_configure(self, config: pytest.Config) -> None:
        """Put the signer where `_session` looks for it."""
        config.stash[SIGNER_KEY] = self.signer


class MatrixFile(pytest.File):
    """matrix.toml: yields one MatrixItem per (backend, probe) cell."""

    def collect(self) -> Iterator[pytest.Item]:
        """The cells, control leg first (later legs are judged against it)."""
        from sandbox_attest.errors import HarnessError  # noqa: PLC0415
        from sandbox_attest.run.runner import applicable_here  # noqa: PLC0415

        try:
            session = _session(self.config, self.path)
        except HarnessError as exc:
            # A bad matrix, policy, key or backend is the user's input: one line that names
            # the fix, not a traceback (pytest reports a collection error, runs no cell and
            # exits 2 "interrupted").
            raise pytest.UsageError(exc.diagnostics()) from exc
        for order, cell in enumerate(session.cells()):
            here = applicable_here(cell)  # the cell as this host can judge it
            yield MatrixItem.from_parent(self, name=here.cell_id, cell=here, order=order)

    def repr_failure(  # type: ignore[override]  # pytest's signature has a style param we ignore
        self, excinfo: pytest.ExceptionInfo[BaseException]
    ) -> str:
        """Bad input is shown as its one line; anything else keeps pytest's report."""
        if isinstance(excinfo.value, pytest.UsageError):
            return f"sandbox-attest: error: {excinfo.value}"
        return str(super().repr_failure(excinfo))


class MatrixItem(pytest.Item):
    """One cell; runs the probe in the backend and turns the verdict into an outcome."""

    def __init__(self, *, cell: Cell, order: int = 0, **kwargs: Any) -> None:
        """Bind the cell and guard it with pytest-timeout (signal method: the session lives)."""
        super().__init__(**kwargs)
        self.cell = cell
        self.order = order  # its place in the matrix: the control leg's cells come first
        self.entry: CellEntry | None = None
        self.add_marker(pytest.mark.cell(cell.backend, cell.probe.id))
        self.add_marker(pytest.mark.timeout(cell.probe.timeout + 60, method="signal"))

    def runtest(self) -> None:
        """Run the cell; PASS returns, excused cells skip with their reason, the rest fail."""
        session = self.config.stash[SESSION_KEY]
        try:
            entry = session.run_cell(self.cell)
        except BaseException as exc:
            # pytest-timeout's Failed or a Ctrl-C cut the cell short: it still leaves an
            # ERROR entry, so the evidence never just lacks it.
            session.record_aborted(self.cell, exc)
            raise
        self.entry = entry
        verdict = entry["verdict"]
        self.user_properties.append(("verdict", verdict))
        if verdict == Verdict.PASS.value:
            return
        if verdict == Verdict.NOT_APPLICABLE.value:
            pytest.skip(f"NOT_APPLICABLE: {entry['reason']}")
        if verdict == Verdict.UNAVAILABLE.value and not entry["required"]:
            pytest.skip(f"UNAVAILABLE: {entry['reason']}")
        if not entry["required"] and self.config.getoption(OPT_FAIL_ON) != "warned":
            # The gate WARNs for it and the run exits 0: pytest must not call it failed.
            self.user_properties.append((WARNED, True))
            return
        raise CellFailed(entry)

    def repr_failure(  # type: ignore[override]  # pytest's signature has a style param we ignore
        self, excinfo: pytest.ExceptionInfo[BaseException]
    ) -> str:
        """The verdict and its reason, not a traceback into the harness."""
        if isinstance(excinfo.value, CellFailed):
            entry = excinfo.value.entry
            text = f"{entry['cell_id']}: {entry['verdict']}\n  reason: {entry['reason']}"
            run = entry.get("run")
            stderr = str(run.get("stderr") or "") if run else ""
            if stderr.strip():
                # Only when the payload said something: `evidence: ""` under every failure
                # was noise (issue 29); the full entry is in evidence.json either way.
                text += f"\n  evidence: {json.dumps(stderr)[:600]}"
            return text
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        """Where the cell comes from, for pytest's reports."""
        return self.path, 0, f"cell {self.name}"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep the matrix's cells in matrix order, control leg first, whatever reordered them.

    In a project's own pytest run (`pytest --sandbox-attest`) its plugins apply: one that
    shuffles tests (pytest-randomly) would run a sandbox's cell before the control leg it is
    judged against, and every PASS would become INCONCLUSIVE. Other tests keep their places;
    only the slots the cells hold are refilled in the order they were collected.
    """
    slots = [i for i, item in enumerate(items) if isinstance(item, MatrixItem)]
    if not slots:
        return
    cells = sorted((items[i] for i in slots), key=lambda item: cast("MatrixItem", item).order)
    for slot, item in zip(slots, cells, strict=True):
        items[slot] = item


def pytest_collection_finish(session: pytest.Session) -> None:
    """Hand the collected cells to the run, which may start them in parallel.

    Cells of the run that pytest did not keep (-k, --deselect, a node id) are recorded as
    deselected: the evidence is then incomplete and the gate fails.
    """
    cells = [item.cell for item in session.items if isinstance(item, MatrixItem)]
    run = session.config.stash.get(SESSION_KEY, None)
    if run is None:
        return
    kept = {cell.cell_id for cell in cells}
    run.deselected = [c.cell_id for c in run.cells() if c.cell_id not in kept]
    if cells:
        run.plan(cells)


def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, str | tuple[str, dict[str, bool]]] | None:
    """Show the verdict word (PASS/FAIL/INCONCLUSIVE/...) instead of PASSED/FAILED."""
    if report.when != "call" or SESSION_KEY not in config.stash:
        return None
    props = dict(report.user_properties)
    verdict = props.get("verdict")
    if verdict is None:
        return None
    if props.get(WARNED):
        return WARNED, "W", (f"{verdict} (not required)", {"yellow": True})
    category = {"PASS": "passed", "NOT_APPLICABLE": "skipped"}.get(str(verdict), report.outcome)
    return category, str(verdict)[0], str(verdict)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The probe x backend grid with verdicts."""
    if SESSION_KEY not in config.stash:
        return
    session = config.stash[SESSION_KEY]
    import shutil  # noqa: PLC0415
    import textwrap  # noqa: PLC0415

    from sandbox_attest.report.grid import render_grid  # noqa: PLC0415

    terminalreporter.write_sep("=", "sandbox-attest verdicts")
    demos = {
        row.name: row.demonstration
        for row in session.matrix.backends
        if row.demonstration and row.name in session.backends
    }
    # COLUMNS or the terminal's width; 80 where neither is known (a CI log, a pipe).
    # pytest's own markup decision covers a terminal, NO_COLOR and --color.
    width = shutil.get_terminal_size((80, 24)).columns
    lines = render_grid(
        session.writer.cells,
        width=width,
        colour=bool(getattr(terminalreporter, "hasmarkup", False)),
        demonstrations=demos,
    )
    for line in lines:
        terminalreporter.write_line(line)
    if not config.stash.get(GATE_BY_CLI_KEY, False):
        # Plain `pytest --sandbox-attest`: the cells it did not fail are named here, since
        # no gate line follows.
        for line in session.gate_warnings():
            terminalreporter.write_line(f"warned: {line}")
    for cell_id in session.missing_required():
        terminalreporter.write_line(f"MISSING required cell {cell_id}")
    from sandbox_attest.report.outcomes import count_line_of  # noqa: PLC0415  (the one count, issue 29)

    count = count_line_of(
        session.writer.cells,
        session.platform,
        session.policy,
        also_missing=session.missing_required(),
    )
    # Wrapped at word boundaries to the grid's width: the same words as every other output,
    # on as many lines as an 80-column terminal needs.
    for line in textwrap.wrap(count, width, subsequent_indent="  ") or [count]:
        terminalreporter.write_line(line)
    for line in session.unrunnable_named():
        terminalreporter.write_line(f"NOT RUNNABLE HERE: {line}")
    if session.deselected:
        terminalreporter.write_line(
            f"DESELECTED {len(session.deselected)} cells: the evidence is incomplete"
        )
    for name in session.not_attested():
        terminalreporter.write_line(
            f"not attested in this run: backend {name} (the release policy requires it; "
            "a release merges every leg)"
        )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Keep the session: its exit status is settled only after the report is signed."""
    session.config.stash[PYTEST_SESSION_KEY] = session


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when the gate does not hold (a missing cell, a control-only run, ...)."""
    run = session.config.stash.get(SESSION_KEY, None)
    if run is None:
        return
    from sandbox_attest.host.lifetime import caught_signal  # noqa: PLC0415

    caught = caught_signal()
    if caught is not None:
        # 128 + the signal's number, as a shell reports a death by it (130 for SIGINT, 143
        # for SIGTERM): pytest would say 2 "interrupted", which a CI cannot tell from bad input.
        session.exitstatus = caught.exit_status
    elif exitstatus == 0 and run.gate_failures():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif (
        exitstatus == 0
        and session.config.getoption(OPT_FAIL_ON) == "warned"
        and run.signed_gate().result == "WARNED"
    ):
        # A WARNED gate with nothing failed in pytest's terms (an unrequired backend that
        # could not run, say): --fail-on warned still asked for exit 1.
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    """Write evidence.json, sign and render (after junit.xml exists).

    A report that could not be signed or rendered fails the run: pytest returns the
    session's exit status after this hook, so plain `pytest matrix/` never exits 0 for it.
    """
    run = config.stash.get(SESSION_KEY, None)
    if run is None:
        _close_signer(config)
        return
    interrupted = config.stash.get(INTERRUPTED_KEY, False)
    # junit.xml and allure-results/ are rendered into the report directory from the judged
    # evidence (sandbox_attest/report/junit.py, sandbox_attest/report/allure.py), so plain `pytest
    # matrix/` gets them too; pytest's --junitxml and allure-pytest's --alluredir, if given, are
    # pytest's own outcomes and not what the gate decided.
    try:
        for line in run.finish(complete=not interrupted):
            print(line)
    finally:
        _close_signer(config)
        from sandbox_attest.host.lifetime import catch_run_signals  # noqa: PLC0415

        # Only now: a signal during finish() must not abandon the report it is writing.
        signals = catch_run_signals()
        signals.restore()
        if signals.later:
            print(
                f"sandbox-attest: {', '.join(signals.later)} arrived while the report was "
                "being written; it was finished first"
            )
    session = config.stash.get(PYTEST_SESSION_KEY, None)
    if run.artifact_errors and session is not None and session.exitstatus == 0:
        for line in run.artifact_errors:
            print(f"sandbox-attest: {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _close_signer(config: pytest.Config) -> None:
    """Stop the signer this plugin started (one handed over is closed by whoever started it)."""
    signer = config.stash.get(SIGNER_KEY, None)
    if signer is not None and config.stash.get(OWNS_SIGNER_KEY, False):
        signer.close()
        del config.stash[SIGNER_KEY]


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    """Mark the run incomplete if the loop ends by interrupt, -x or an error."""
    from sandbox_attest.host.lifetime import caught_signal, hold_run_signals  # noqa: PLC0415

    try:
        result = yield
    except BaseException:
        session.config.stash[INTERRUPTED_KEY] = True
        raise
    if session.shouldstop or session.shouldfail or caught_signal() is not None:
        # A signal that some code turned into another exception, or swallowed, still cut
        # the run: the recorded signal decides, not whether its exception reached pytest.
        session.config.stash[INTERRUPTED_KEY] = True
    if session.config.stash.get(SESSION_KEY, None) is not None:
        # Every cell ran: a signal from here on is recorded, and the report is finished first.
        hold_run_signals()
    return result
