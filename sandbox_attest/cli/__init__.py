"""`sandbox-attest run | backends | serve | verify | merge`; main(argv=None) for tests."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest import __version__
from sandbox_attest.errors import ConfigError, HarnessError
from sandbox_attest.host.console import readers_may_leave
from sandbox_attest.host.lifetime import RunInterrupted, catch_run_signals, caught_signal
from sandbox_attest.host.proctitle import harness_title, set_title
from sandbox_attest.paths import default_matrix, default_policy, default_pytest_ini
from sandbox_attest.plugin import HELP_PAYLOAD_USER
from sandbox_attest.report.files import make_report_dir
from sandbox_attest.run.setup import (
    check_inputs,
    check_payload_user,
    start_run,
    start_signer,
    use_payload_user,
)

if TYPE_CHECKING:
    from sandbox_attest.attest.signer import Signer

HELP_OUT = "a new or empty report directory (default: reports/<run-id>)"
HELP_JSON = "print one JSON object on stdout at the end instead of the human lines' summary"
# Every subcommand's --help ends with these, so a script knows what each status means.
EXIT_CODES = """exit codes:
  0    passed (the gate holds; for verify and merge: the report verifies)
  1    the gate FAILED, or it WARNED (a cell nothing required did not PASS: an escape in a
       default-included backend, say) and --fail-on warned was given; verify/merge refused
  2    usage or input error (bad flag, missing file or directory, unusable key or policy);
       for run also: --key was given but the run's trust domains were not separated, so
       the report was written and signed with the per-machine key instead (no release)
  129  run cut short by SIGHUP (a closed terminal)
  130  run cut short by SIGINT (Ctrl-C)
  143  run cut short by SIGTERM (timeout, a CI cancel, docker stop)
       For 129, 130 and 143 the cell in flight is ERROR, and evidence.json, the views and the
       attestation are still written and signed with complete: false; the gate line says
       FAILED. A second signal meanwhile is ignored; SIGKILL is not, and the next run
       sweeps what a killed run left (its output and evidence.json say what, under swept)."""
# `run --key K` whose trust domains were not separated: signed with the per-machine key.
EXIT_KEY_REFUSED = 2
# gate_failures' line for a required cell the run never produced (run/requirements.py).
MISSING_PREFIX = "missing required cell "
# --fail-on: which gate words exit 1. `failed` (default) lets a WARNED run exit 0, as a
# developer's first run should; a CI that must not ship any escape it sees asks for `warned`.
FAIL_ON = ("failed", "warned")
HELP_FAIL_ON = (
    "exit 1 when the gate is FAILED (default: failed), or when it is FAILED or WARNED "
    "(warned: any cell nothing required that did not PASS, e.g. a FAIL in a backend the "
    "default set included, fails the job)"
)
# A gate line longer than this is shortened at a word boundary, pointing at the report.
GATE_LINE_LIMIT = 400


def plural(n: int, word: str, many: str | None = None) -> str:
    """`n` and `word`, with the plural form when `n` is not 1 ("1 reason", "2 reasons")."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def shorten(line: str, limit: int = GATE_LINE_LIMIT) -> str:
    """`line` cut at a word boundary to `limit` characters, saying where the rest is."""
    import textwrap  # noqa: PLC0415

    return textwrap.shorten(line, limit, placeholder=" ... (the full reason is in report.html)")


HELP_KEY = (
    "Ed25519 private key PEM for signing (or SANDBOX_ATTEST_SIGNING_KEY); default: an "
    "untrusted per-machine key. A release key signs only a run whose trust domains were "
    "separated (every sandboxed process measured as neither root nor the harness's uid); "
    "otherwise the run signs with the per-machine key and says why: with --key it then exits "
    "2 (you insisted on the release key), with the variable it prints a warning line only"
)
HELP_JOBS = "cells to run at once (default 1); the control leg still runs first"
# Defaults come from the installed package, wherever the command runs: a `matrix/` folder in
# the current directory is used only when named (`--policy matrix/policy.toml`).
HELP_POLICY = "release policy TOML (default: the one the package ships, matrix/policy.toml)"
HELP_MATRIX = "matrix TOML, any file name (default: the one the package ships)"
HELP_PROBE = (
    "run only this probe (repeatable) on the named backends (--backend, --backend-spec) and "
    "the control leg, judged by a policy derived for it (each named cell must PASS; the "
    "policy's exclusions still hold): no matrix or policy to write"
)
HELP_WORLD = (
    "where the fixture hosts live: auto (the lab on Linux as root, else loopback, the reason "
    "recorded), lab (required: fail where it cannot be made), loopback (default: auto)"
)


def _cmd_run(args: argparse.Namespace) -> int:
    # From the first moment: SIGTERM before the matrix starts still ends in a gate line and
    # 128 + its number (main), never in a silent death.
    catch_run_signals()
    # A reader that goes away (`run | head`) must not take the report with it: main() keeps
    # every subcommand's streams alive (sandbox_attest/host/console.py).
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from sandbox_attest.run.focus import focused  # noqa: PLC0415

    matrix = Path(args.matrix) if args.matrix else default_matrix()
    policy = Path(args.policy) if args.policy else default_policy()
    # `--probe`: a matrix and policy of just those cells, derived for this run (focus.py).
    with focused(args.probe, matrix, policy, args.backend, args.backend_spec) as inputs:
        return _run_with(args, *inputs)


def _run_with(args: argparse.Namespace, matrix: Path, policy: Path) -> int:
    check_inputs(matrix, policy, args.backend, args.backend_spec)
    # Before the signer starts (it checks that this user cannot read the key) and before
    # pytest runs in this process: host/trust.py reads the variable on each lookup.
    use_payload_user(args.payload_user)
    check_payload_user()
    # The lab, the signer, the run id and the report directory, as every run starts
    # (sandbox_attest/run/setup.py); the signer is handed to the plugin and closed here.
    key = Path(args.key) if args.key else None
    start = start_run(world=args.world, key=key, signer_for=start_signer, report_dir=args.out)
    with start.signer as signer:
        _warn_unseparated(signer)
        try:
            # 0700 and empty: only this run's harness writes there (sandbox_attest.report.files).
            make_report_dir(start.report_dir)
        except ConfigError as exc:
            raise ConfigError(f"--out {exc}") from exc
        return _run_pytest(args, matrix, policy, start.report_dir, signer, start.run_id)


def _run_pytest(
    args: argparse.Namespace,
    matrix: Path,
    policy: Path,
    out: Path,
    signer: Signer,
    run_id: str,
) -> int:
    import pytest  # noqa: PLC0415  (only `run` needs pytest loaded)

    from sandbox_attest import plugin  # noqa: PLC0415
    from sandbox_attest.plugin import SignerHandoff  # noqa: PLC0415

    # The matrix's own pytest.ini when it has one beside it, else the shipped one (a matrix
    # kept elsewhere must not pick up an unrelated project's pytest settings).
    ini = matrix.parent / "pytest.ini"
    pytest_args = [
        str(matrix),
        "-v",
        # The rootdir is where the command runs: pytest shows ids relative to it, and an
        # installed matrix elsewhere would read `../venv/lib/.../matrix.toml::none-...`
        # (the plugin names the file by itself then). No conftest.py of this directory or
        # above the matrix is loaded into a run: only the matrix's own folder may have one.
        f"--rootdir={Path.cwd()}",
        f"--confcutdir={matrix.resolve().parent}",
        "-c",
        str(ini if ini.is_file() else default_pytest_ini()),
        # The plugin collects only the matrix it is asked for; the CLI's short options are
        # translated to the plugin's prefixed ones (sandbox_attest/plugin/__init__.py).
        f"{plugin.OPT_MATRIX}={matrix}",
        # No --junitxml and no --alluredir: the session renders junit.xml and
        # allure-results/ from the judged evidence (report/junit.py, allure_results.py).
        f"{plugin.OPT_RUN_ID}={run_id}",
        f"{plugin.OPT_REPORT_DIR}={out}",
        f"{plugin.OPT_POLICY}={policy}",
        # The package is imported already (this CLI is part of it), so pytest could not
        # rewrite its asserts and would warn on every run; the matrix's items assert nothing.
        "--assert=plain",
    ]
    pytest_args += [f"{plugin.OPT_SPEC}={Path(spec).resolve()}" for spec in args.backend_spec]
    for name in args.backend:
        pytest_args.append(f"{plugin.OPT_BACKEND}={name}")
        if args.require_backend:
            pytest_args.append(f"{plugin.OPT_REQUIRE}={name}")
    if args.key:
        pytest_args.append(f"{plugin.OPT_KEY}={args.key}")
    if args.jobs > 1:
        pytest_args.append(f"{plugin.OPT_JOBS}={args.jobs}")
    pytest_args.append(f"{plugin.OPT_WORLD}={args.world}")
    # The plugin then shows an unrequired non-PASS cell as failed too, as the gate will.
    pytest_args.append(f"{plugin.OPT_FAIL_ON}={args.fail_on}")
    # With --json, stdout carries the one JSON object and nothing else: everything a person
    # reads (the cells as they finish, the grid, the gate lines) goes to stderr instead.
    human = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with human:
        print(f"sandbox-attest {__version__}: run {run_id}, report -> {out}", flush=True)
        gate = _GateWatch()
        code = int(pytest.main(pytest_args, plugins=[gate, SignerHandoff(signer)]))
        status = _run_status(code, gate, args.fail_on)
    if args.json:
        _print_run_json(run_id, out, gate, status, args.fail_on)
    return status


def _run_status(code: int, gate: _GateWatch, fail_on: str = "failed") -> int:
    """The run's exit status from pytest's code, the gate, and a signal that cut it short."""
    import pytest  # noqa: PLC0415

    caught = caught_signal()
    if caught is not None:
        # Cut short: the report is written (incomplete), so the gate is printed as ever; it
        # can only say FAILED, and the status says which signal (130, 143, 129).
        gate.report()
        return caught.exit_status
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return code  # interrupted, usage or internal error: never a pass
    status = gate.report(fail_on)
    # --key insisted on the release key, and the run could not earn it: the report is
    # signed with the per-machine key, and the status says the key was not usable (issue 23).
    return EXIT_KEY_REFUSED if gate.key_insisted else status


def _print_run_json(
    run_id: str, out: Path, gate: _GateWatch, status: int, fail_on: str = "failed"
) -> None:
    """The run's final gate and paths as one JSON object (`run --json`)."""
    import json  # noqa: PLC0415

    names = ("evidence.json", "attestation.intoto.jsonl", "junit.xml", "report.html")
    paths = {
        name: str(out / name) for name in (*names, "summary.md", "results.sarif", "allure-results")
    }
    print(
        json.dumps(
            {
                "run_id": run_id,
                "report_dir": str(out),
                "exit_code": status,
                # --fail-on warned exits 1 on a WARNED gate: the gate word stays WARNED.
                "gate": (
                    "FAILED"
                    if gate.failures or (status and gate.signed != "WARNED")
                    else gate.signed
                ),
                "fail_on": fail_on,
                "signed_gate": gate.signed,
                "failures": gate.failures or [],
                "warnings": gate.warnings,
                "paths": paths,
            },
            indent=2,
        )
    )


class _GateWatch:
    """Reads the release gate off the run before pytest tears it down."""

    def __init__(self) -> None:
        self.failures: list[str] | None = None
        self.warnings: list[str] = []
        self.signed = "FAILED"
        self.key_refused = ""
        self.key_insisted = False

    def report(self, fail_on: str = "failed") -> int:
        """Print the gate and return the run's exit status (0 only if it holds)."""
        if self.failures is None:
            print("gate: FAILED: no matrix ran, so nothing was attested", file=sys.stderr)
            return 1
        return _print_gate(self.failures, self.warnings, self.signed, fail_on)

    def pytest_configure(self, config: Any) -> None:
        """Tell the plugin that this CLI prints the gate lines (so its summary does not)."""
        from sandbox_attest.plugin import GATE_BY_CLI_KEY  # noqa: PLC0415

        config.stash[GATE_BY_CLI_KEY] = True

    @pytest.hookimpl(trylast=True)  # after the plugin has signed and rendered the report
    def pytest_unconfigure(self, config: Any) -> None:
        """Collect the gate's failures (None when no matrix ran) and the signed word."""
        from sandbox_attest.plugin import INTERRUPTED_KEY, SESSION_KEY  # noqa: PLC0415

        run = config.stash.get(SESSION_KEY, None)
        if run is not None:
            interrupted = config.stash.get(INTERRUPTED_KEY, False)
            self.warnings = run.gate_warnings()
            caught = caught_signal()
            cut = (
                f"the run was cut short by {caught.signame}"
                if caught
                else "the run was interrupted"
            )
            self.failures = (
                run.gate_failures() + ([cut] if interrupted else []) + run.artifact_errors
            )
            self.signed = run.signed_gate(complete=not interrupted).result
            self.key_refused = run.release_key_refused
            self.key_insisted = run.release_key_insisted


def _print_gate(
    failures: list[str], warnings: list[str], signed: str, fail_on: str = "failed"
) -> int:
    """Print the gate; its last word is the one the attestation signs (never a milder one).

    `signed` is `evaluate`'s result (PASSED/WARNED/FAILED); the session's own checks
    (missing cells, a control-only run, an unsigned report) can only make it FAILED.
    `fail_on` "warned" makes a WARNED gate exit 1 too (--fail-on warned).
    """
    for line in warnings:
        print(f"gate: warning: {shorten(line)}")
    missing = [line for line in failures if line.startswith(MISSING_PREFIX)]
    for line in failures:
        if line not in missing:
            print(f"gate: {shorten(line)}")
    if missing:
        # The grid's summary listed each MISSING cell already (plugin.py); a cut-short run
        # has dozens, and the same list twice buried the gate (issue 29).
        print(
            f"gate: {plural(len(missing), 'required cell')} never ran (each is listed as "
            "MISSING above)"
        )
    if failures or signed == "FAILED":
        print("gate: FAILED")
        return 1
    if signed == "WARNED":
        strict = fail_on == "warned"
        print(
            f"gate: WARNED: every required cell PASSed; {plural(len(warnings), 'warning')} "
            "above (cells nothing required that did not PASS)"
            + (
                "; exit 1 (--fail-on warned)"
                if strict
                else "; exit 0 (--fail-on warned would fail it)"
            )
        )
        return 1 if strict else 0
    if warnings:
        print(f"gate: PASSED (every required cell PASSed; {plural(len(warnings), 'note')} above)")
    else:
        print("gate: PASSED (every required cell PASSed)")
    return 0


def _warn_unseparated(signer: Signer) -> None:
    """Say before any cell runs that a release key cannot sign a run that cannot separate.

    The run still goes on (a developer's check is worth having), and at its end the signer
    swaps the key for the per-machine one (issue 23); said first, a user can stop now, before
    the code under test runs beside a key it can read.
    """
    from sandbox_attest.host.trust import separation_possible  # noqa: PLC0415

    ok, why = separation_possible()
    if signer.requested and not ok:
        print(
            f"sandbox-attest: warning: {why}; so the release key ({signer.requested}) will not "
            "sign this run (the per-machine key will), and the code under test can read it: "
            "stop now (Ctrl-C) and run as root to keep it out of reach",
            file=sys.stderr,
            flush=True,
        )


def _claims(policy: dict[str, Any]) -> str:
    """Declared claims in plain words: "network proxy, limits nofile=256 forks=32"."""

    def word(value: object) -> str:
        if isinstance(value, dict):
            return " ".join(f"{k}={word(v)}" for k, v in value.items())
        if isinstance(value, list | tuple):
            return ",".join(word(v) for v in value) or "none"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return str(value)

    return ", ".join(f"{k} {word(v)}" for k, v in policy.items()) or "none declared"


def _cmd_backends(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415

    from sandbox_attest.backends import create_backend  # noqa: PLC0415
    from sandbox_attest.run.matrix import current_platform, load_matrix  # noqa: PLC0415
    from sandbox_attest.run.setup import with_spec_backends  # noqa: PLC0415

    matrix = load_matrix(Path(args.matrix) if args.matrix else default_matrix())
    # A spec given here is loaded (a broken one stops with its file, key and fix) and shown
    # with the rest: detection, its check and the test command under its own argv all run.
    matrix, _ = with_spec_backends(matrix, [], list(args.backend_spec))
    platform = current_platform()
    rows: list[dict[str, Any]] = []
    for row in matrix.backends:
        if platform not in row.platforms:
            rows.append({"name": row.name, "status": "NOT_APPLICABLE", "reason": row.reason})
            continue
        backend = create_backend(row.name)
        avail = backend.availability()
        if avail.ok and avail.identity is not None:
            ident = avail.identity
            rows.append(
                {
                    "name": row.name,
                    # The words the evidence uses: AVAILABLE, UNAVAILABLE, NOT_APPLICABLE.
                    "status": "AVAILABLE",
                    "version": ident.version,
                    "platform": ident.platform,
                    # Every claim the probes judge, each with its source (issue 29).
                    "claims": ident.claims.claims(),
                    "claim_sources": _claim_rows(backend, ident.claims),
                    "profile_digest": ident.profile_digest,
                    # A command wrapper's check and what its test command saw: why AVAILABLE.
                    **{
                        k: ident.profile[k] for k in ("check", "test_command") if k in ident.profile
                    },
                    **({"note": avail.reason} if avail.reason else {}),
                }
            )
        else:
            rows.append({"name": row.name, "status": "UNAVAILABLE", "reason": avail.reason})
        if row.demonstration:
            # In the default set to show a verdict (matrix.toml): said wherever it is listed.
            rows[-1]["demonstration"] = row.demonstration
    if args.json:
        print(json.dumps({"platform": platform, "backends": rows}, indent=2, default=str))
        return 0
    _print_backend_rows(rows)
    return 0


def _print_backend_rows(rows: list[dict[str, Any]]) -> None:
    """`backends` for people: one line per backend, its details indented under it."""
    for r in rows:
        if r["status"] == "AVAILABLE":
            print(
                f"{r['name']:14} available       {r['version']}; {r['platform']}; "
                f"claims: {_claims(r['claims'])}; profile {r['profile_digest']}"
            )
            if "test_command" in r:
                print(
                    f"{'':14} {'':15} check: {r['check']}; test command under its argv: "
                    f"{_claims(r['test_command'])}"
                )
            if "note" in r:
                print(f"{'':14} {'':15} {r['note']}")
            for c in r["claim_sources"]:
                print(f"{'':14} {'':15} {c['claim']} = {c['value']}  ({c['source']})")
        else:
            print(f"{r['name']:14} {r['status']:15} {r['reason']}")
        if "demonstration" in r:
            print(f"{'':14} {'':15} demonstration: {r['demonstration']}")


def _claim_rows(backend: object, policy: Any) -> list[dict[str, str]]:
    """The backend's claims with their sources (sandbox_attest/report/claimview.py)."""
    from sandbox_attest.backends.command.spec import CommandSpec  # noqa: PLC0415
    from sandbox_attest.backends.command.spec_claims import claim_sources  # noqa: PLC0415
    from sandbox_attest.report.claimview import claim_rows  # noqa: PLC0415

    spec = getattr(backend, "spec", None)
    if isinstance(spec, CommandSpec):
        return claim_rows(policy, claim_sources(spec))
    # A built-in backend declares its claims in its own module (its CLAIMS).
    return claim_rows(policy, None, type(backend).__module__.replace(".", "/") + ".py")


def _cmd_serve(args: argparse.Namespace) -> int:
    from sandbox_attest.world.core import serve  # noqa: PLC0415

    return serve(Path(args.run_dir) if args.run_dir else None, args.world)


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`run`: the probe matrix, judged, signed and rendered."""
    run = sub.add_parser("run", help="run the probe matrix and write a signed report")
    run.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help="backend to attest (repeatable); default: all of this platform",
    )
    run.add_argument(
        "--backend-spec",
        action="append",
        default=[],
        metavar="FILE",
        help="command-wrapper spec TOML to attest too (repeatable); a name X "
        "given to --backend finds matrix/backends/X.toml by itself",
    )
    run.add_argument(
        "--require-backend",
        action="store_true",
        help="also require the cells of each --backend that do not apply here (matrix "
        "[[exclude]] or platform): they then fail the run. A named backend's applicable "
        "cells are required already, UNAVAILABLE ones included",
    )
    run.add_argument(
        "--probe",
        action="append",
        default=[],
        metavar="NAME",
        help=HELP_PROBE,
    )
    run.add_argument("--out", help=HELP_OUT)
    run.add_argument("--policy", help=HELP_POLICY)
    run.add_argument("--matrix", help=HELP_MATRIX)
    run.add_argument(
        "--key",
        help=HELP_KEY,
    )
    run.add_argument("-j", "--jobs", type=int, default=1, help=HELP_JOBS)
    run.add_argument(
        "--world", choices=("auto", "lab", "loopback"), default="auto", help=HELP_WORLD
    )
    run.add_argument("--json", action="store_true", help=HELP_JSON)
    run.add_argument("--fail-on", choices=FAIL_ON, default="failed", help=HELP_FAIL_ON)
    run.add_argument("--payload-user", metavar="NAME", help=HELP_PAYLOAD_USER)
    run.set_defaults(func=_cmd_run)


def _add_backends(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`backends`: each backend of the matrix and whether it runs here."""
    backends = sub.add_parser("backends", help="list backends and whether they run here")
    backends.add_argument("--matrix", help=HELP_MATRIX)
    backends.add_argument("--json", action="store_true", help="print the list as JSON")
    backends.add_argument(
        "--backend-spec",
        action="append",
        default=[],
        metavar="FILE",
        help="also load this command-wrapper spec TOML (repeatable), run its detection, its "
        "check and a test command under its argv, and print why it is (un)available",
    )
    backends.set_defaults(func=_cmd_backends)


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`serve`: the world alone, for a person to look at."""
    serve = sub.add_parser("serve", help="start the world, print it as JSON, wait")
    serve.add_argument("--run-dir", help="where sockets, logs and the CA bundle go")
    serve.add_argument(
        "--world", choices=("auto", "lab", "loopback"), default="auto", help=HELP_WORLD
    )
    serve.set_defaults(func=_cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the whole CLI."""
    parser = argparse.ArgumentParser(
        prog="sandbox-attest",
        description="Attest that a sandbox holds: live escape probes, host witnesses, signed.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sandbox-attest {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_run(sub)
    _add_backends(sub)
    _add_serve(sub)
    try:
        from sandbox_attest.cli.release import register  # noqa: PLC0415
    except ImportError:
        pass
    else:
        register(sub)
    # A vendor's tools, each in its own module (issue 29).
    from sandbox_attest.report.explain import register as register_explain  # noqa: PLC0415

    register_explain(sub)
    from sandbox_attest.report.diff import register as register_diff  # noqa: PLC0415

    register_diff(sub)
    for choice in sub.choices.values():
        # verify and merge are registered elsewhere: every --help ends with the codes.
        choice.epilog = EXIT_CODES
        choice.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `sandbox-attest` console script."""
    if argv is None:
        # Run as a program (not called by a test): every wrapper is this process's child and
        # reads its command line, so it shows a neutral one from here on (issue 23).
        set_title(harness_title())
    # Every subcommand's output (and --help's) may be piped into a reader that stops early
    # (`verify --json | head -1`): Python's recipe for SIGPIPE (docs: signal, "Note on
    # SIGPIPE") points stdout at /dev/null once the reader is gone, and the command's own
    # exit status stands. The final flush is inside, so the last buffered write is covered.
    with readers_may_leave():
        try:
            return _dispatch(build_parser().parse_args(argv))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()


def _dispatch(args: argparse.Namespace) -> int:
    """Run the chosen subcommand; bad input and an early signal end in one line each."""
    try:
        return int(args.func(args))
    except HarnessError as exc:
        print(f"sandbox-attest: error: {exc.diagnostics()}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        # Before pytest started (or after it ended): nothing was judged, nothing is signed.
        print(f"sandbox-attest: cut short by {exc.signame} before any cell ran", file=sys.stderr)
        print("gate: FAILED: the run was cut short before any cell ran, so nothing was attested")
        return exc.exit_status
