"""`verify --subject PATH` / `--subject-digest sha256:...`: did this build of a sandbox PASS?

A release pipeline holds a sandbox binary (bwrap, srt's cli.js, a codex build, runsc) and asks
whether a verified report says it PASSED. `answer` finds the signed test-result statements
whose subject is that file's sha256 (issue 30: each backend's statement names what it ran) in a
report that `verify_report` already checked, and answers with the backend, its result, the
claims it held and when the run finished. It refuses, with the reason, when:

- the report itself does not verify (its statements cannot be believed);
- the report was signed before issue 30 (its subject is the report files, not a sandbox);
- no statement names that digest: either the file at PATH is not the executable that ran
  (a statement names the same path with another digest), or the report tested other
  binaries only;
- the only statements naming it are the control leg's, which attests no sandbox;
- in a merged release, only an informational leg (not part of the decision) tested it;
- the statement about it did not PASS (FAILED; or WARNED, when `strict`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest.verification import PRE_ISSUE_30_NOTE
from sandbox_attest.errors import ConfigError

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from sandbox_attest.attest.verification import SandboxResult, Verification

_DIGEST = re.compile(r"sha256:(?P<hex>[0-9a-f]{64})")


def parse_subject_digest(text: str) -> str:
    """A `--subject-digest` value, `sha256:<64 hex>`, as its lowercase hex.

    Raises:
        ConfigError: anything else, naming the form.
    """
    match = _DIGEST.fullmatch(text.strip().lower())
    if match is None:
        raise ConfigError(
            f"--subject-digest {text!r} is not sha256:<64 hex digits>; compute it with "
            "`sha256sum FILE`, or pass the file itself with --subject"
        )
    return match["hex"]


def file_sha256(path: Path) -> str:
    """Hex sha256 of the file at `path`, following symlinks as executing it would.

    Raises:
        ConfigError: the file cannot be read, naming the path.
    """
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ConfigError(
            f"--subject {path}: cannot read ({exc.strerror}); pass the sandbox's executable"
        ) from exc
    return digest.hexdigest()


@dataclass
class SubjectAnswer:
    """What the verified report says about one subject.

    Attributes:
        digest: the subject's sha256 (hex).
        path: the file it was read from (None for --subject-digest).
        matches: every verified statement naming the digest (control leg's included).
        reasons: why the answer is not PASSED; empty means that sandbox build PASSED.
        claims: backend -> the claims its signed identity made (for the matched backends).
    """

    digest: str
    path: str | None
    matches: list[SandboxResult] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True only when a non-control statement names the subject and it passed."""
        return not self.reasons

    def as_json(self) -> dict[str, Any]:
        """The answer as JSON data for `verify --json`."""
        return {
            "digest": f"sha256:{self.digest}",
            "path": self.path,
            "ok": self.ok,
            "statements": [
                {
                    "backend": m.backend,
                    "leg": m.leg or None,
                    "control": m.control,
                    "result": m.result,
                    "finishedAt": m.finished_at,
                    "passedTests": list(m.passed),
                    "claims": self.claims.get(m.backend, {}),
                }
                for m in self.matches
            ],
            "reasons": list(self.reasons),
        }


def _sandboxes(
    result: Verification, *, deciding: bool = True
) -> list[tuple[SandboxResult, dict[str, Any]]]:
    """Every verified sandbox statement with its backend's claims (merged: every leg's).

    Of a merged release only the legs that decided it count: an informational leg (macOS,
    Windows) is shown by the merge, but the release says nothing about its builds.
    """
    if result.leg_results:
        out: list[tuple[SandboxResult, dict[str, Any]]] = []
        for label, leg in result.leg_results:
            if deciding != bool(leg.legs & result.legs):
                continue
            for sandbox in leg.sandboxes:
                labelled = dataclasses.replace(sandbox, leg=label)
                out.append((labelled, leg.claims.get(sandbox.backend, {})))
        return out
    return [(s, result.claims.get(s.backend, {})) for s in result.sandboxes]


def _legacy(result: Verification) -> bool:
    runs = [leg for _, leg in result.leg_results] or [result]
    return any(PRE_ISSUE_30_NOTE in leg.notes for leg in runs)


def _no_match_reason(digest: str, path: Path | None, found: list[SandboxResult]) -> str:
    """Why no statement names `digest`: another binary at the same path, or none at all."""
    name = os.path.realpath(path) if path is not None else None
    same_path = [
        (s.backend, d) for s in found for n, d in s.subjects if name is not None and n == name
    ]
    if same_path:
        backend, signed = same_path[0]
        return (
            f"{path} has sha256 {digest[:16]}..., but the statement for backend {backend} "
            f"names {name} with sha256 {signed[:16]}...: this file is not the executable that "
            "ran, so no result in this report is about it"
        )
    tested = sorted({n for s in found for n, _ in s.subjects if not s.control})
    return (
        f"no statement in this report has subject sha256:{digest}: the report tested "
        f"{', '.join(tested) or 'no sandbox'}; a statement for another binary says nothing "
        "about this one"
    )


def answer(
    result: Verification, digest: str, path: Path | None, *, strict: bool = False
) -> SubjectAnswer:
    """Answer whether the sandbox build with sha256 `digest` PASSED in a verified report.

    Args:
        result: `verify_report`'s verification of the report (single or merged).
        digest: the subject's sha256, hex.
        path: the file the digest was read from, to name a same-path mismatch (None: a digest).
        strict: WARNED does not count as passed (`--fail-on warned`).
    """
    out = SubjectAnswer(digest, str(path) if path is not None else None)
    if not result.ok:
        out.reasons.append(
            "the report does not verify, so no statement in it can be believed (see its reasons)"
        )
    if _legacy(result):
        out.reasons.append(
            f"{PRE_ISSUE_30_NOTE}; re-run the matrix with this version to attest the sandbox"
        )
        return out
    found = _sandboxes(result)
    for sandbox, claims in found:
        if any(d == digest for _, d in sandbox.subjects):
            out.matches.append(sandbox)
            out.claims[sandbox.backend] = claims
    if not out.matches:
        shown = [s for s, _ in _sandboxes(result, deciding=False)]
        informational = sorted({s.leg for s in shown if any(d == digest for _, d in s.subjects)})
        if informational:
            out.reasons.append(
                f"only informational leg(s) {', '.join(informational)} tested this file: they "
                "are shown by the release, never part of its decision"
            )
        else:
            out.reasons.append(_no_match_reason(digest, path, [s for s, _ in found]))
        return out
    tested = [m for m in out.matches if not m.control]
    if not tested:
        out.reasons.append(
            "only the control leg's statement names this file (the unconfined leg's "
            "interpreter, say): the control attests no sandbox"
        )
        return out
    allowed = {"PASSED"} if strict else {"PASSED", "WARNED"}
    out.reasons.extend(
        f"backend {m.backend}{f' (leg {m.leg})' if m.leg else ''} ran this file and its signed "
        f"result is {m.result}"
        for m in tested
        if m.result not in allowed
    )
    return out


def run_subject(args: argparse.Namespace, result: Verification, keyid: str) -> int:
    """`verify --subject/--subject-digest`: print the answer (or its JSON); the exit code.

    0 when that sandbox build PASSED (or WARNED, unless --fail-on warned) in a report that
    verifies; 1 with every reason otherwise; 2 when the subject cannot be read or parsed.
    """
    try:
        if args.subject is not None:
            path: Path | None = args.subject
            digest = file_sha256(args.subject)
        else:
            path = None
            digest = parse_subject_digest(args.subject_digest)
    except ConfigError as exc:
        print(f"error: {exc.diagnostics()}", file=sys.stderr)
        return 2
    found = answer(result, digest, path, strict=args.fail_on == "warned")
    code = 0 if found.ok else 1
    what = str(path) if path is not None else f"sha256:{digest}"
    if args.json:
        data = {
            "report_dir": str(args.report_dir),
            "keyid": keyid,
            "report_ok": result.ok,
            "subject": found.as_json(),
            "report_reasons": list(result.reasons),
            "notes": list(result.notes),
            "exit_code": code,
        }
        print(json.dumps(data, indent=2))
        return code
    for m in found.matches:
        leg = f" (leg {m.leg})" if m.leg else ""
        role = "control leg" if m.control else "sandbox under test"
        print(
            f"{what}: backend {m.backend}{leg}, {role}: {m.result}, run finished "
            f"{m.finished_at or '?'}"
        )
        claims = found.claims.get(m.backend) or {}
        if claims and not m.control:
            held = ", ".join(f"{k} = {v}" for k, v in sorted(claims.items()))
            print(f"  claims held: {held}")
            print(f"  passed: {len(m.passed)} cells")
    if found.ok:
        print(f"OK: {what} PASSED in {args.report_dir} (verified with key {keyid})")
        return code
    print(f"REFUSED: {what} ({len(found.reasons)} reason(s)):", file=sys.stderr)
    for reason in [*found.reasons, *result.reasons]:
        print(f"  - {reason}", file=sys.stderr)
    return code
