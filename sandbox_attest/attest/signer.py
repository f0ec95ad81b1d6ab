"""The signer: a separate process that alone holds the signing key and signs what was judged.

Issue 12 (a): the key was readable from inside the trust domain of the code being judged, in
`/proc/<ancestor>/environ` (`$SANDBOX_ATTEST_SIGNING_KEY`) or through `--key PATH` in a
cmdline. So a run starts this process once, before any cell, as
`python -m sandbox_attest.attest.signer` with a scrubbed environment and no inherited descriptors.
Its first act is `prctl(PR_SET_DUMPABLE, 0)` (its /proc files become root's and ptrace is
refused) and `prctl(PR_SET_PDEATHSIG, SIGKILL)` (it dies with the harness). Only then does
the key source arrive, over its stdin pipe: a file path, the PEM text the harness took out of
`$SANDBOX_ATTEST_SIGNING_KEY` (and deleted from its own environment), or "local" for the
per-machine key. The key is loaded once by `keys.load_signing_key` and kept in this process's
memory; it is never in any environment, argv or file the payload uid can read.

Issue 12 (b): the signer never re-reads what it signs. The session hands over the exact bytes
it judged; the signer re-derives the gate from them and refuses when it differs from the
session's, then writes every file itself (`sign_judged`, `reportfs.write_new`).

Protocol: each message is a frame of a 4-byte big-endian length and that many bytes of UTF-8
JSON, requests on the child's stdin and replies on its stdout; bytes travel base64-encoded.

    -> {"op": "init", "key": {"kind": "path"|"env-path"|"pem"|"local", ...},
        "payload": {"uid": int|null, "gids": [int]}, "sigstore_env": {...}}
    <- {"ok": true, "keyid", "trust", "source", "public_key_pem", "hardening", "sigstore"}
    -> {"op": "refuse-release", "reason"}     (the run's trust domains were not separated)
    <- {"ok": true, "refused": {"keyid", "reason"}|null, "keyid", "trust", "source",
        "public_key_pem"}
    -> {"op": "sign", "report_dir", "files": {name: b64}, "policy": b64|null,
        "policy_path", "gate"}
    <- {"ok": true, "attestation", "gate", "sigstore": {"status", "reason"},
        "refused": {"keyid", "reason"}|null}
    -> {"op": "close"}            (or EOF: the signer exits)
    <- {"ok": false, "error": "config"|"report", "message"} for any refused request

Issue 23: a release key signs only a run whose trust domains were separated, as measured
(`sandbox_attest.host.separation`): where any sandboxed process ran as root or as the harness's
uid, that code could read the key (`/proc/<harness>/cmdline`, `environ`, the key file), and
could forge what is signed. The signer then swaps the provided key for the per-machine one
before signing (`refuse-release`, and again in `sign` from the evidence it signs, so a
session that forgot to ask cannot get a release signature over such a run).

What this does not do: Python cannot wipe a string, so the PEM text stays in this process's
heap until it is reused; non-dumpable keeps other uids (and core dumps) away from it, root can
still read it. Removing the variable from `os.environ` does not rewrite the harness's own
`/proc/<pid>/environ` (the kernel shows the environment the process was started with); only
the payload running as another uid keeps that file out of reach.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import json
import os
import queue
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

from sandbox_attest.attest import EVIDENCE_NAME, sign_judged
from sandbox_attest.attest.keys import (
    ENV_VAR,
    SigningKey,
    check_key_file_private,
    load_signing_key,
    public_key_pem,
)
from sandbox_attest.attest.sigstore import OPT_OUT_VAR, SigstoreDecision, decide
from sandbox_attest.errors import ConfigError, HarnessError, ReportError
from sandbox_attest.host.proctitle import set_title, signer_title
from sandbox_attest.report.files import open_report_dir
from sandbox_attest.report.policy import Policy, parse_policy
from sandbox_attest.report.signature import ED25519_ONLY, SignerFacts

if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping
    from types import TracebackType

    from sandbox_attest.host.trust import PayloadUser

# Linux <linux/prctl.h>.
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a report's views and evidence; far above any real run
START_TIMEOUT = 60.0  # interpreter start, imports and key load on a loaded 2-core runner
SIGN_TIMEOUT = 120.0
KEYLESS_TIMEOUT = 600.0  # Fulcio and Rekor are remote
# Only these reach the signer, nothing else of the harness's environment: keyless signing's
# identity, and the CI run a statement's `url` names (issue 30; public values, no secret).
SIGSTORE_VARS = (
    "SIGSTORE_ID_TOKEN",
    "ACTIONS_ID_TOKEN_REQUEST_URL",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
    OPT_OUT_VAR,
    "GITHUB_SERVER_URL",
    "GITHUB_REPOSITORY",
    "GITHUB_RUN_ID",
)
_DEFAULT_PAYLOAD: Any = (
    object()
)  # "ask sandbox_attest.host.trust" (None means "no separate payload uid")


def _package_root() -> Path:
    """The directory holding the `sandbox_attest` package (a clone's root, or site-packages)."""
    return Path(__file__).resolve().parents[2]


# --- framing (both sides) ------------------------------------------------------------------


def _encode(message: Mapping[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode("utf-8")
    return _HEADER.pack(len(body)) + body


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _read_frame(stream: IO[bytes]) -> dict[str, Any] | None:
    """One message, or None at end of stream."""
    header = _read_exact(stream, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ReportError(f"signer protocol: a {size}-byte frame is over the {MAX_FRAME} limit")
    body = _read_exact(stream, size)
    if body is None:
        return None
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ReportError("signer protocol: a frame is not a JSON object")
    return message


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# --- the signer process --------------------------------------------------------------------


def harden() -> dict[str, str]:
    """Make this process non-dumpable and bound to its parent's life; say what took effect."""
    if not sys.platform.startswith("linux"):
        reason = f"not available on {sys.platform} (prctl is Linux-only)"
        return {"dumpable": reason, "pdeathsig": reason}
    libc = ctypes.CDLL(None, use_errno=True)
    facts: dict[str, str] = {}
    for name, option, value, done in (
        ("dumpable", PR_SET_DUMPABLE, 0, "0"),
        ("pdeathsig", PR_SET_PDEATHSIG, int(signal.SIGKILL), "SIGKILL"),
    ):
        if libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) == 0:
            facts[name] = done
        else:
            facts[name] = f"prctl failed: {os.strerror(ctypes.get_errno())}"
    if facts["dumpable"] == "0" and libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        facts["dumpable"] = "prctl(PR_SET_DUMPABLE, 0) did not take effect"
    return facts


def policy_from_bytes(data: bytes, path_text: str) -> Policy:
    """Parse the policy bytes the session handed over; the policy names `path_text`.

    Raises:
        ConfigError: the bytes are not a valid policy (the message names `path_text`).
    """
    return parse_policy(data, Path(path_text))


def _load_key(spec: Mapping[str, Any], payload: Mapping[str, Any]) -> SigningKey:
    kind = spec.get("kind")
    uid = payload.get("uid")
    gids = {int(g) for g in payload.get("gids") or []}
    if kind in ("path", "env-path"):
        path = Path(str(spec["path"]))
        # Loaded first, so a missing or malformed key gets load_signing_key's message; then
        # refused, before anything is signed, if the payload uid could read the file: a
        # signature by a key the judged code could have used proves nothing.
        if kind == "path":
            key = load_signing_key(path, {})
        else:
            key = load_signing_key(None, {ENV_VAR: str(path)})
        check_key_file_private(path, int(uid) if uid is not None else None, gids)
        return key
    if kind == "pem":
        return load_signing_key(None, {ENV_VAR: str(spec["pem"])})
    if kind == "local":
        env = {k: str(v) for k, v in (spec.get("env") or {}).items() if v}
        return load_signing_key(None, env)
    raise ConfigError(f"signer protocol: unknown key source {kind!r}")


def evidence_separated(evidence_bytes: bytes | None) -> tuple[bool, str]:
    """Whether the evidence about to be signed says its trust domains were separated.

    Anything else (no fact, a declared one from before issue 23, unparsable bytes) is not
    separated: a release key is kept for runs that proved it.
    """
    try:
        evidence = json.loads(evidence_bytes or b"")
    except (ValueError, UnicodeDecodeError):
        return False, "the evidence handed to the signer is not JSON"
    domains = evidence.get("trust_domains") if isinstance(evidence, dict) else None
    if not isinstance(domains, dict) or domains.get("measured") is not True:
        return False, "the evidence records no measured trust domains"
    if domains.get("separated") is not True:
        return False, str(domains.get("reason") or "the trust domains were not separated")
    return True, ""


@dataclass
class _Server:
    """The signer's state: the key (after init) and the keyless-signing environment."""

    key: SigningKey | None = None
    sigstore_env: dict[str, str] = dataclasses.field(default_factory=dict)
    hardening: dict[str, str] = dataclasses.field(default_factory=dict)
    # HOME / XDG_CONFIG_HOME: where the per-machine key lives, for `refuse-release`.
    local_env: dict[str, str] = dataclasses.field(default_factory=dict)
    refused: dict[str, str] | None = None
    # Why keyless signing is off for this run ("" when `decide` rules): its OIDC identity
    # must not vouch for a run whose code could have used the same token.
    keyless_refused: str = ""

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        if op == "init":
            return self._init(message)
        if op == "refuse-release":
            self._refuse_release(str(message.get("reason") or "not separated"))
            decision = self._decision()
            return {
                "ok": True,
                "refused": self.refused,
                **self._key_facts(),
                "sigstore": {"status": decision.status, "reason": decision.reason},
            }
        if op == "sign":
            return self._sign(message)
        raise ConfigError(f"signer protocol: unknown op {op!r}")

    def _key_facts(self) -> dict[str, Any]:
        assert self.key is not None  # noqa: S101  (callers check init first)
        return {
            "keyid": self.key.keyid,
            "trust": self.key.trust,
            "source": self.key.source,
            "public_key_pem": public_key_pem(self.key.public_key).decode("ascii"),
        }

    def _init(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.key is not None:
            raise ConfigError("signer protocol: the key was loaded already")
        self.sigstore_env = {k: str(v) for k, v in (message.get("sigstore_env") or {}).items()}
        self.local_env = {k: str(v) for k, v in (message.get("local_env") or {}).items() if v}
        spec = message.pop("key", None) or {}
        self.key = _load_key(spec, message.get("payload") or {})
        del spec  # the PEM text, if any: drop the last reference the protocol held
        decision = decide(self.sigstore_env)
        return {
            "ok": True,
            **self._key_facts(),
            "hardening": self.hardening,
            "sigstore": {"status": decision.status, "reason": decision.reason},
        }

    def _decision(self) -> SigstoreDecision:
        if self.keyless_refused:
            return SigstoreDecision(attempt=False, status=ED25519_ONLY, reason=self.keyless_refused)
        return decide(self.sigstore_env)

    def _refuse_release(self, reason: str) -> None:
        """Swap a provided (release) key for the per-machine key and turn keyless off."""
        if self.key is None:
            raise ConfigError("signer protocol: refuse-release before init")
        self.keyless_refused = (
            f"keyless signing skipped: the trust domains were not separated ({reason})"
        )
        if self.key.trust != "provided":
            return
        released = self.key.keyid
        # The release key is dropped: nothing of this run may be signed with it any more.
        self.key = load_signing_key(None, self.local_env)
        self.refused = {"keyid": released, "reason": reason}

    def _sign(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.key is None:
            raise ConfigError("signer protocol: sign before init")
        report_dir = Path(str(message["report_dir"]))
        files = {str(n): base64.b64decode(v) for n, v in (message.get("files") or {}).items()}
        separated, why = evidence_separated(files.get(EVIDENCE_NAME))
        if not separated:
            self._refuse_release(why)
        raw_policy = message.get("policy")
        policy_path = str(message.get("policy_path") or "policy.toml")
        policy = (
            policy_from_bytes(base64.b64decode(raw_policy), policy_path) if raw_policy else None
        )
        dir_fd = open_report_dir(report_dir)
        try:
            signed = sign_judged(
                report_dir,
                dir_fd,
                self.key,
                files,
                policy=policy,
                expected_gate=str(message["gate"]),
                env=self.sigstore_env,
                keyless_refused=self.keyless_refused,
            )
        finally:
            os.close(dir_fd)
        return {
            "ok": True,
            "attestation": str(signed.attestation),
            "gate": signed.gate.result,
            "sigstore": {"status": signed.sigstore.status, "reason": signed.sigstore.reason},
            "refused": self.refused,
            **self._key_facts(),
        }


def _error_reply(exc: BaseException) -> dict[str, Any]:
    kind = "config" if isinstance(exc, ConfigError) else "report"
    message = exc.diagnostics() if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
    return {"ok": False, "error": kind, "message": message}


def serve(requests: IO[bytes], replies: IO[bytes], hardening: dict[str, str]) -> int:
    """Answer requests until `close` or end of input; every failure becomes an error reply."""
    server = _Server(hardening=hardening)
    while True:
        try:
            message = _read_frame(requests)
        except (ReportError, ValueError) as exc:
            replies.write(_encode(_error_reply(exc)))
            replies.flush()
            return 2
        if message is None or message.get("op") == "close":
            return 0
        try:
            reply = server.handle(message)
        except (HarnessError, OSError, KeyError, ValueError, TypeError) as exc:
            reply = _error_reply(exc)
        replies.write(_encode(reply))
        replies.flush()


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m sandbox_attest.attest.signer --parent PID`."""
    args = sys.argv[1:] if argv is None else argv
    facts = harden()  # first, before anything secret can arrive
    # Its command line is world-readable in /proc, the payload user's too (issue 23).
    set_title(signer_title())
    if len(args) == 2 and args[0] == "--parent" and os.getppid() != int(args[1]):
        return 3  # the harness died before PDEATHSIG was armed: nobody to sign for
    # The protocol owns the original stdin/stdout; anything printed by accident (a library's
    # warning) goes to stderr instead of corrupting a frame.
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return serve(requests, replies, facts)


# --- the client (the harness side) ---------------------------------------------------------


@dataclass(frozen=True)
class SignReply:
    """What the signer wrote: the attestation's path, the signed gate, keyless's outcome."""

    attestation: Path
    gate: str
    sigstore: SigstoreDecision


def _local_env(env: Mapping[str, str]) -> dict[str, str]:
    """Where the per-machine key lives (HOME, XDG_CONFIG_HOME), as the signer needs it."""
    return {name: env.get(name, "") for name in ("HOME", "XDG_CONFIG_HOME")} | (
        {} if env.get("HOME") else {"HOME": str(Path.home())}
    )


def _key_spec(key_path: Path | None, value: str, env: Mapping[str, str]) -> dict[str, Any]:
    if key_path is not None:
        return {"kind": "path", "path": str(key_path.absolute())}
    value = value.strip()
    if value.startswith("-----BEGIN"):
        return {"kind": "pem", "pem": value}
    if value:
        return {"kind": "env-path", "path": str(Path(value).absolute())}
    return {"kind": "local", "env": _local_env(env)}


def _scrubbed_env() -> dict[str, str]:
    """The signer's whole environment: how to import the harness, and nothing else."""
    env = {
        "PYTHONPATH": str(_package_root()),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }
    if "SYSTEMROOT" in os.environ:  # Windows cannot start Python without it
        env["SYSTEMROOT"] = os.environ["SYSTEMROOT"]
    return env


def _spawn_signer_process() -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """Start `python -m sandbox_attest.attest.signer` in its own session; stderr to a temp file.

    Raises:
        ReportError: the process could not be started.
    """
    stderr = tempfile.TemporaryFile()  # noqa: SIM115  (kept open for the signer's life)
    argv = [
        sys.executable,
        "-P",
        "-m",
        "sandbox_attest.attest.signer",
        "--parent",
        str(os.getpid()),
    ]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=_scrubbed_env(),
            close_fds=True,
            cwd=_package_root(),
            # Its own session: a Ctrl-C, a closed terminal or a CI cancel signals the
            # harness's process group, and the signer must still sign the interrupted
            # run's report. It dies with the harness anyway (PR_SET_PDEATHSIG).
            start_new_session=True,
        )
    except OSError as exc:
        stderr.close()
        raise ReportError(f"cannot start the signer process ({' '.join(argv)}): {exc}") from exc
    return proc, stderr


class Signer:
    """A running signer process and the facts it answered with.

    No public constructor: get one from `Signer.start`, before any cell runs, and `close` it
    (or use it as a context manager) when the run is over. Its methods are safe to call from
    one thread at a time; a lock serializes them.
    """

    def __init__(self, proc: subprocess.Popen[bytes], stderr: IO[bytes]) -> None:
        """Wrap a started process; use `Signer.start`."""
        self._proc = proc
        self._stderr = stderr
        self._lock = threading.Lock()
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_replies, name="signer-replies")
        self._reader.daemon = True
        self._reader.start()
        self.keyid = ""
        self.trust = ""
        self.source = ""
        self.public_key_pem = b""
        self.hardening: dict[str, str] = {}
        self.sigstore = SigstoreDecision(attempt=False, status="", reason="")
        # How the key was asked for: "--key", "$SANDBOX_ATTEST_SIGNING_KEY", or "" (the
        # per-machine key). `--key` insists: a run that cannot use it exits 2 (cli.py).
        self.requested = ""
        # Set when the release key was refused for this run (`refuse_release`): one line.
        self.refusal = ""

    @property
    def pid(self) -> int:
        """The signer process's pid."""
        return self._proc.pid

    @property
    def facts(self) -> SignerFacts:
        """Who signs, for report.html and summary.md (rendered before the signature)."""
        return SignerFacts(self.keyid, self.trust, self.sigstore.status, self.sigstore.reason)

    @classmethod
    def start(
        cls,
        key_path: Path | None,
        env: MutableMapping[str, str],
        *,
        payload: PayloadUser | None = _DEFAULT_PAYLOAD,
        timeout: float = START_TIMEOUT,
    ) -> Signer:
        """Start the signer and have it load the key: `--key`, the variable, or the local key.

        `$SANDBOX_ATTEST_SIGNING_KEY` is read and deleted from `env` first thing, so nothing
        started after this (a cell, a wrapper, a helper) inherits it, even if starting the
        signer fails.

        Args:
            key_path: `--key FILE`; wins over the variable.
            env: the harness's environment (pass `os.environ`); the variable is removed.
            payload: the payload user the key file must be private from; by default
                `sandbox_attest.host.trust.payload_user()` (None: the domains are not separated).
            timeout: seconds to wait for the signer's first answer.

        Returns:
            A signer holding the key.

        Raises:
            ConfigError: the key cannot be read, is the payload's to read, is encrypted or
                not Ed25519 (the message names the fix).
            ReportError: the signer process did not start or answer.
        """
        value = env.pop(ENV_VAR, "")
        spec = _key_spec(key_path, value, env)
        requested = "--key" if key_path is not None else f"${ENV_VAR}" if value.strip() else ""
        del value
        if payload is _DEFAULT_PAYLOAD:
            from sandbox_attest.host.trust import payload_user  # noqa: PLC0415  (pwd/grp: POSIX only)

            payload = payload_user()
        groups = sorted({payload.gid, *payload.groups}) if payload is not None else []
        signer = cls(*_spawn_signer_process())
        try:
            reply = signer._request(
                {
                    "op": "init",
                    "key": spec,
                    "payload": {"uid": payload.uid if payload else None, "gids": groups},
                    "sigstore_env": {k: env[k] for k in SIGSTORE_VARS if k in env},
                    "local_env": _local_env(env),
                },
                timeout,
            )
        except BaseException:
            signer.close()
            raise
        finally:
            spec.clear()
        signer.requested = requested
        signer._take_init_reply(reply)
        return signer

    def _take_init_reply(self, reply: Mapping[str, Any]) -> None:
        """Keep what the signer answered to init: the key's facts, hardening, keyless's plan."""
        self._take_key_facts(reply)
        self.hardening = {str(k): str(v) for k, v in reply["hardening"].items()}
        facts = reply["sigstore"]
        status = str(facts["status"])
        self.sigstore = SigstoreDecision(
            attempt=status != "ed25519 only", status=status, reason=str(facts["reason"])
        )

    def _take_key_facts(self, reply: Mapping[str, Any]) -> None:
        self.keyid = str(reply["keyid"])
        self.trust = str(reply["trust"])
        self.source = str(reply["source"])
        self.public_key_pem = str(reply["public_key_pem"]).encode("ascii")

    def _refusal_line(self, refused: Mapping[str, Any]) -> str:
        """The one line a run prints when its release key was refused."""
        asked = self.requested or "the provided key"
        insisted = (
            "; the run exits 2 because --key insists on the release key"
            if self.requested == "--key"
            else ""
        )
        return (
            f"signing: the release key {refused.get('keyid', '?')} ({asked}) was NOT used: "
            f"the trust domains were not separated ({refused.get('reason', '')}), so code "
            "under test may have read that key; signed with the per-machine key "
            f"{self.keyid} instead, which is no release{insisted}. Run as root without "
            '[run] user = "root" for a release, and rotate the key if that code was hostile'
        )

    def refuse_release(self, reason: str) -> str:
        """Have the signer drop a provided key for the per-machine key; the line to print.

        Call it when the run's trust domains were not separated, before rendering the views
        (they name the signing key). Idempotent; a per-machine key is kept as it is.

        Returns:
            The one line saying what was refused and why ("" when nothing was refused).

        Raises:
            ConfigError: the per-machine key cannot be loaded or made.
            ReportError: the signer died.
        """
        reply = self._request({"op": "refuse-release", "reason": reason}, SIGN_TIMEOUT)
        self._take_key_facts(reply)
        facts = reply["sigstore"]
        status = str(facts["status"])
        self.sigstore = SigstoreDecision(status != ED25519_ONLY, status, str(facts["reason"]))
        refused = reply.get("refused")
        if isinstance(refused, dict) and not self.refusal:
            self.refusal = self._refusal_line(refused)
        return self.refusal

    def sign_report(
        self,
        report_dir: Path,
        files: Mapping[str, bytes],
        *,
        policy_bytes: bytes | None,
        policy_path: str,
        gate: str,
        timeout: float | None = None,
    ) -> SignReply:
        """Have the signer write `files` into `report_dir` and sign them (see `sign_judged`).

        Args:
            report_dir: the run's report directory (0700, the harness's).
            files: the exact bytes of evidence.json, junit.xml, report.html and summary.md.
            policy_bytes: the policy file's bytes as the run loaded them (None: no policy).
            policy_path: the path the run loaded the policy from, for the statement.
            gate: the gate result the session decided; the signer refuses a different one.
            timeout: seconds to wait (default: longer when keyless signing is attempted).

        Returns:
            What was written and signed.

        Raises:
            ReportError: the signer refused (gates differ, a file cannot be written) or died.
            ConfigError: the report directory or the policy bytes are unusable.
        """
        if timeout is None:
            timeout = KEYLESS_TIMEOUT if self.sigstore.attempt else SIGN_TIMEOUT
        reply = self._request(
            {
                "op": "sign",
                "report_dir": str(report_dir.absolute()),
                "files": {name: _b64(data) for name, data in files.items()},
                "policy": _b64(policy_bytes) if policy_bytes is not None else None,
                "policy_path": policy_path,
                "gate": gate,
            },
            timeout,
        )
        refused = reply.get("refused")
        if isinstance(refused, dict) and not self.refusal:
            # The session did not ask first; the signer refused on its own from the evidence.
            self._take_key_facts(reply)
            self.refusal = self._refusal_line(refused)
        facts = reply["sigstore"]
        status = str(facts["status"])
        return SignReply(
            attestation=Path(str(reply["attestation"])),
            gate=str(reply["gate"]),
            sigstore=SigstoreDecision(status != "ed25519 only", status, str(facts["reason"])),
        )

    def close(self) -> None:
        """Ask the signer to exit, and stop it if it does not within 5 s. Idempotent."""
        with self._lock:
            stdin = self._proc.stdin
            if stdin is not None:
                if self._proc.poll() is None:
                    with contextlib.suppress(OSError, ValueError):
                        stdin.write(_encode({"op": "close"}))
                        stdin.flush()
                # Closed even when the signer is gone: a buffered pipe still holding a request
                # would otherwise fail again when it is garbage-collected.
                with contextlib.suppress(OSError, ValueError):
                    stdin.close()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            with contextlib.suppress(OSError, ValueError):
                if self._proc.stdout is not None:
                    self._proc.stdout.close()
            self._stderr.close()

    def __enter__(self) -> Self:
        """The signer itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the signer."""
        self.close()

    # -- internals --

    def _read_replies(self) -> None:
        stream = self._proc.stdout
        try:
            while stream is not None:
                message = _read_frame(stream)
                self._replies.put(message)
                if message is None:
                    return
        except (OSError, ValueError, ReportError):
            self._replies.put(None)

    def _died(self, what: str) -> ReportError:
        code = self._proc.poll()
        tail = ""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:].decode("utf-8", "replace").strip()
        status = f"exited with status {code}" if code is not None else "stopped answering"
        return ReportError(
            f"the signer process (pid {self.pid}) {status} {what}"
            + (f"; it said: {tail}" if tail else "")
            + "; the report was not signed: re-run, and check the key with --key"
        )

    def _request(self, message: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            stdin = self._proc.stdin
            if stdin is None or stdin.closed or self._proc.poll() is not None:
                raise self._died("before this request")
            try:
                stdin.write(_encode(message))
                stdin.flush()
            except (OSError, ValueError) as exc:
                raise self._died(f"while receiving the request ({exc})") from exc
            try:
                reply = self._replies.get(timeout=timeout)
            except queue.Empty:
                self._proc.kill()
                self._proc.wait()
                raise self._died(f"after no answer for {timeout:.0f} s (it was stopped)") from None
            if reply is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5)
                raise self._died("before answering")
        if not reply.get("ok"):
            text = str(reply.get("message") or "the signer refused without a reason")
            if reply.get("error") == "config":
                raise ConfigError(text)
            raise ReportError(text)
        return reply


if __name__ == "__main__":
    sys.exit(main())
