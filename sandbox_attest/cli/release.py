"""The `verify` and `merge` subcommands of `sandbox-attest` (registered by `register`).

Exit codes: 0 the report (or merge) holds; 1 it does not, with every reason listed on stderr;
2 the inputs are unusable (a missing report directory, bad key, bad policy, bad
--expect-legs), with the fix named. `sandbox_attest.cli` adds them to every --help.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_attest.attest.keys import load_signing_key, load_trusted_key
from sandbox_attest.attest.merge import load_expected_legs, merge_legs
from sandbox_attest.attest.verification import (
    DEFAULT_MAX_AGE,
    Checks,
    format_duration,
    parse_commit,
    parse_max_age,
)
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.errors import HarnessError
from sandbox_attest.paths import default_legs, default_policy
from sandbox_attest.report.policy import load_policy

if TYPE_CHECKING:
    import argparse
    from typing import Any

    from sandbox_attest.attest.verification import Verification

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

# The package's own copies: a run from an installed wheel has no matrix/ in its directory.
DEFAULT_POLICY = default_policy()
DEFAULT_LEGS = default_legs()
HELP_TRUSTED_KEY = "PEM Ed25519 public key whose signatures count (`openssl pkey -in KEY -pubout`)"
HELP_POLICY = (
    "release policy: which probes must PASS on which platform/backend "
    "(default: the one the package ships, matrix/policy.toml)"
)
HELP_ALLOW_LOCAL = (
    "accept a report signed by a per-machine (untrusted) local key; that key must also be "
    "the --trusted-key"
)
HELP_ALLOW_SHARED = (
    "accept a run whose trust domains were not separated (a sandboxed process ran as root or "
    "as the harness's uid, measured and signed) or not measured (a report from before issue "
    "23); such code could read the signing key, so this is never a release"
)
HELP_MAX_AGE = (
    "refuse a report whose signed finishedAt is older than this (e.g. 30d, 12h, 90m; "
    f"default {format_duration(DEFAULT_MAX_AGE)}); `none` or 0 skips the check"
)
HELP_EXPECT_COMMIT = (
    "the signed harness commit must start with this (7-40 hex digits) and come from a clean "
    "checkout; a wheel-installed harness records no commit and fails it"
)
HELP_PARTIAL = (
    "verify one machine's report: legs the policy names that this report does not hold are "
    "not required (every cell of the legs it does hold still is); a release uses merge + "
    "a full verify instead"
)


def _checks(args: argparse.Namespace) -> Checks:
    """The --max-age / --expect-commit checks, and this user's untrusted-key registry.

    Raises:
        ConfigError: a bad value, or an unsafe registry.
    """
    commit = parse_commit(args.expect_commit) if args.expect_commit else None
    # The registry is read here, once, so an unsafe one is a usage error (exit 2).
    registry = Checks().untrusted()
    return Checks(parse_max_age(args.max_age), commit, registry)


def _domains_line(domains: dict[str, Any]) -> str:
    if not domains:
        return "trust domains: not recorded"
    reason = domains.get("reason") or ""
    measured = "" if domains.get("measured") is True else " (declared, not measured)"
    if domains.get("separated"):
        user = domains.get("payload_user") or domains.get("payload_uid")
        return (
            f"trust domains: separated{measured} (payloads ran as {user}, uid "
            f"{domains.get('payload_uid')}; harness uid {domains.get('harness_uid')}) {reason}"
        ).rstrip()
    return f"trust domains: NOT separated{measured}: {reason or 'no reason recorded'}"


def _domains_json(domains: dict[str, Any]) -> dict[str, Any]:
    """The signed trust-domains fact for `verify --json`: the run's word and each backend's."""
    backends = domains.get("backends")
    return {
        "separated": domains.get("separated") is True,
        "measured": domains.get("measured") is True,
        "harness_uid": domains.get("harness_uid"),
        "reason": str(domains.get("reason") or ""),
        "backends": {
            str(name): {
                key: fact.get(key)
                for key in ("status", "separated", "uids", "gids", "launched_as", "reason")
            }
            for name, fact in (backends.items() if isinstance(backends, dict) else [])
            if isinstance(fact, dict)
        },
    }


def _harness_line(harness: dict[str, Any]) -> str:
    commit = harness.get("commit") or "none (wheel install)"
    state = harness.get("dirty")
    dirty = " (dirty)" if state is True else " (clean)" if state is False else ""
    return f"harness {harness.get('version', '?')} commit {commit}{dirty}"


def claims_line(claims: dict[str, Any]) -> str:
    """A backend's claims on one line, in the TOML words of its `[claims]`."""
    parts = []
    for key, value in claims.items():
        if isinstance(value, dict):  # reads = {deny = [...]}, writes = {allow = [...]}
            (word, paths), *_ = value.items()
            parts.append(f"{key}={word}[{', '.join(map(str, paths))}]")
        elif isinstance(value, list):
            parts.append(f"{key}=[{', '.join(map(str, value))}]")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts) or "none"


def _print_facts(result: Verification) -> None:
    """What the signed statements say was tested: harness, times, trust domains, world."""
    runs = result.leg_results or [("", result)]
    if result.leg_results:
        print(f"merge: {_harness_line(result.harness)}")
    for label, leg in runs:
        prefix = f"leg {label}: " if label else ""
        print(f"{prefix}{_harness_line(leg.harness)}, finished {leg.finished_at or '?'}")
        print(f"{prefix}{_domains_line(leg.trust_domains)}")
        backends = leg.trust_domains.get("backends")
        for name, fact in sorted(backends.items() if isinstance(backends, dict) else []):
            if isinstance(fact, dict) and fact.get("status") != "separated":
                print(f"{prefix}trust domain of {name}: {fact.get('status')}: {fact.get('reason')}")
        if leg.world:
            print(f"{prefix}world: {leg.world.get('kind', '?')} {leg.world.get('reason', '')}")
        for backend, claims in sorted(leg.claims.items()):
            print(f"{prefix}claims of {backend}: {claims_line(claims)}")
        for sandbox in leg.sandboxes:  # issue 30: what each backend's statement is about
            role = "control leg" if sandbox.control else "tested"
            names = ", ".join(f"{n} sha256:{d[:12]}" for n, d in sandbox.subjects)
            print(f"{prefix}sandbox {sandbox.backend} ({role}, {sandbox.result}): {names}")
    for note in dict.fromkeys(n for _, leg in runs for n in leg.notes + result.notes):
        print(f"note: {note}")


def _sandboxes_json(result: Verification) -> list[dict[str, Any]]:
    """The verified sandbox statements of one report, for `verify --json`."""
    return [
        {
            "backend": s.backend,
            "control": s.control,
            "result": s.result,
            "finishedAt": s.finished_at,
            "subjects": [{"name": n, "sha256": d} for n, d in s.subjects],
        }
        for s in result.sandboxes
    ]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _verify_json(
    args: argparse.Namespace, result: Verification, keyid: str, gate: str, code: int
) -> dict[str, Any]:
    """`verify --json`'s object: the verdict, the signed facts, and the exit code."""
    return {
        "report_dir": str(args.report_dir),
        "ok": result.ok,
        # Only a verified gate is reported: a tampered report's own word is not
        # one a script may act on (issue 29).
        "gate": gate if result.ok else None,
        "fail_on": args.fail_on,
        "keyid": keyid,
        "partial": bool(args.partial),
        "reasons": list(result.reasons),
        # Each backend's signed claims; per leg label for a merged release.
        "claims": (
            {label: leg.claims for label, leg in result.leg_results}
            if result.leg_results
            else result.claims
        ),
        # The signed trust-domains fact; per leg label for a merged release.
        "trust_domains": (
            {label: _domains_json(leg.trust_domains) for label, leg in result.leg_results}
            if result.leg_results
            else _domains_json(result.trust_domains)
        ),
        # Each backend's test-result statement: its subjects (what it ran) and
        # result; per leg label for a merged release (issue 30).
        "sandboxes": (
            {label: _sandboxes_json(leg) for label, leg in result.leg_results}
            if result.leg_results
            else _sandboxes_json(result)
        ),
        "notes": list(result.notes),
        "exit_code": code,
    }


def _print_verdict(
    args: argparse.Namespace, result: Verification, keyid: str, gate: str, *, strict: bool
) -> int:
    """Print OK, REFUSED (--fail-on warned) or FAILED with every reason; the exit code."""
    _print_facts(result)
    if strict:
        print(
            f"REFUSED: {args.report_dir} verifies with key {keyid}, but its gate is "
            "WARNED and --fail-on warned was given (a cell nothing required did not PASS)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    if result.ok:
        scope = " (partial: only the legs this report holds)" if args.partial else ""
        print(f"OK: {args.report_dir} verifies with key {keyid} (gate {gate}){scope}")
        return EXIT_OK
    print(
        f"FAILED: {args.report_dir} does not verify ({_plural(len(result.reasons), 'reason')}):",
        file=sys.stderr,
    )
    for reason in result.reasons:
        print(f"  - {reason}", file=sys.stderr)
    return EXIT_REFUSED


def _run_verify(args: argparse.Namespace) -> int:
    if not args.report_dir.is_dir():
        # An input error, not a refusal: nothing was verified, the path is wrong.
        print(
            f"error: {args.report_dir} is not a directory; pass the report directory that "
            "`sandbox-attest run` wrote (reports/<run-id>) or a merged release's --out",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        trusted = load_trusted_key(args.trusted_key)
        policy = load_policy(args.policy)
        checks = _checks(args)
    except HarnessError as exc:
        print(f"error: {exc.diagnostics()}", file=sys.stderr)
        return EXIT_USAGE
    result = verify_report(
        args.report_dir,
        trusted,
        policy,
        allow_untrusted_local=args.allow_untrusted_local,
        require_all_legs=not args.partial,
        checks=checks,
        allow_shared_trust_domain=args.allow_shared_trust_domain,
    )
    if args.subject is not None or args.subject_digest is not None:
        # Issue 30: the pipeline's question about one sandbox build (attest/subject_query.py).
        from sandbox_attest.attest.subject_query import run_subject  # noqa: PLC0415

        return run_subject(args, result, trusted.keyid)
    gate = result.gate.result if result.gate else "unknown"
    # --fail-on warned (issue 29): a report that verifies but whose gate is WARNED is refused.
    strict = args.fail_on == "warned" and result.ok and gate == "WARNED"
    code = EXIT_REFUSED if strict or not result.ok else EXIT_OK
    if args.json:
        print(json.dumps(_verify_json(args, result, trusted.keyid, gate, code), indent=2))
        return code
    return _print_verdict(args, result, trusted.keyid, gate, strict=strict)


def _run_merge(args: argparse.Namespace) -> int:
    try:
        trusted = load_trusted_key(args.trusted_key)
        policy = load_policy(args.policy)
        expected = load_expected_legs(args.expect_legs)
        key = load_signing_key(args.key, os.environ)
        checks = _checks(args)
        result = merge_legs(
            args.leg_dirs,
            expected=expected,
            trusted=trusted,
            policy=policy,
            key=key,
            out_dir=args.out,
            allow_untrusted_local=args.allow_untrusted_local,
            checks=checks,
            allow_shared_trust_domain=args.allow_shared_trust_domain,
        )
    except HarnessError as exc:
        print(f"error: {exc.diagnostics()}", file=sys.stderr)
        return EXIT_USAGE
    for note in result.notes:  # informational legs: shown, never a refusal
        print(f"note: {note}")
    if result.ok:
        legs = ", ".join(f"{p}/{b}" for p, b in sorted(result.legs))
        print(
            f"OK: merged {_plural(len(result.legs), 'leg')} ({legs}) -> {result.attestation} "
            f"(gate {result.result})"
        )
        return EXIT_OK
    print(
        f"REFUSED: merge not written ({_plural(len(result.reasons), 'reason')}):",
        file=sys.stderr,
    )
    for reason in result.reasons:
        print(f"  - {reason}", file=sys.stderr)
    return EXIT_REFUSED


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `verify` and `merge` subcommands; each sets `func(args) -> exit code`."""
    _add_verify(subparsers)
    _add_merge(subparsers)


def _add_verify(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`sandbox-attest verify REPORT_DIR --trusted-key PUB ...`."""
    verify = subparsers.add_parser(
        "verify",
        help="check a signed report against a trusted key and the release policy",
        description="Exit 0 only if every signature, digest, the gate and the policy hold.",
    )
    verify.add_argument("report_dir", type=Path, metavar="REPORT_DIR")
    verify.add_argument(
        "--trusted-key", type=Path, required=True, metavar="PUB", help=HELP_TRUSTED_KEY
    )
    verify.add_argument("--policy", type=Path, default=DEFAULT_POLICY, help=HELP_POLICY)
    verify.add_argument("--allow-untrusted-local", action="store_true", help=HELP_ALLOW_LOCAL)
    verify.add_argument("--allow-shared-trust-domain", action="store_true", help=HELP_ALLOW_SHARED)
    verify.add_argument("--partial", action="store_true", help=HELP_PARTIAL)
    verify.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object on stdout; its gate is null unless the "
        "report verifies",
    )
    verify.add_argument(
        "--fail-on",
        choices=("failed", "warned"),
        default="failed",
        help="refuse (exit 1) a report whose signed gate is FAILED (default: failed), or "
        "FAILED or WARNED (warned)",
    )
    subject = verify.add_mutually_exclusive_group()
    subject.add_argument(
        "--subject",
        type=Path,
        default=None,
        metavar="PATH",
        help="answer for this sandbox executable (bwrap, srt's cli.js, runsc...): find the "
        "signed statements whose subject is its sha256 and say whether it PASSED",
    )
    subject.add_argument(
        "--subject-digest",
        default=None,
        metavar="sha256:HEX",
        help="as --subject, for a digest (a container image id, a binary not on this machine)",
    )
    _add_pins(verify)
    verify.set_defaults(func=_run_verify)


def _add_merge(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`sandbox-attest merge LEG_DIR... --out DIR --trusted-key PUB ...`."""
    merge = subparsers.add_parser(
        "merge",
        help="verify CI legs and sign one release decision over all of them",
        description="Refuses (writes nothing) on a leg that fails, a duplicate or a missing leg.",
    )
    merge.add_argument("leg_dirs", type=Path, nargs="+", metavar="LEG_DIR")
    merge.add_argument(
        "--expect-legs",
        type=Path,
        default=DEFAULT_LEGS,
        metavar="FILE",
        help=(
            'TOML: [[leg]] platform = "linux" backend = "bubblewrap", one per leg (default: '
            "the package's matrix/legs.toml, the legs of its own CI)"
        ),
    )
    merge.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="an empty or new directory for the release: legs/NN-<dir>/ copies and the "
        "merged attestation.intoto.jsonl (written to a temporary directory, then renamed)",
    )
    merge.add_argument(
        "--trusted-key", type=Path, required=True, metavar="PUB", help=HELP_TRUSTED_KEY
    )
    merge.add_argument(
        "--key",
        type=Path,
        default=None,
        metavar="KEY",
        help="PEM Ed25519 private key to sign the merge (else "
        "$SANDBOX_ATTEST_SIGNING_KEY; the untrusted local key only with "
        "--allow-untrusted-local)",
    )
    merge.add_argument("--policy", type=Path, default=DEFAULT_POLICY, help=HELP_POLICY)
    merge.add_argument(
        "--allow-untrusted-local",
        action="store_true",
        help=HELP_ALLOW_LOCAL + "; also lets the merge itself be signed by it",
    )
    merge.add_argument("--allow-shared-trust-domain", action="store_true", help=HELP_ALLOW_SHARED)
    _add_pins(merge)
    merge.set_defaults(func=_run_merge)


def _add_pins(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-age", default=format_duration(DEFAULT_MAX_AGE), metavar="DURATION", help=HELP_MAX_AGE
    )
    parser.add_argument("--expect-commit", default=None, metavar="SHA", help=HELP_EXPECT_COMMIT)
