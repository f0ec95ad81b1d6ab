"""proc_syscall_surface asks the kernel what a socket() descriptor is before counting it.

Issue 27: any descriptor `socket(AF_NETLINK)` returned counted as reaching the kernel's
netlink, though a sandbox (a seccomp user-notify or ptrace supervisor) may hand back a
socketpair it controls. The payload now reports what the descriptor is (fstat, and the
kernel's SO_DOMAIN, SO_TYPE and SO_PROTOCOL for it), and the host counts only a socket of
the family asked for as the kernel's. Unit tests judge recorded reports; the live ones run
the real payload, unsandboxed, on this host (netlink sockets open unprivileged).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from sandbox_attest.catalog import PROBES, probe_path
from sandbox_attest.catalog.proc import syscall_surface
from sandbox_attest.verdict import Verdict, decide
from tests.catalog.test_proc import CONFINED, Records, att, make_ctx

PROBE = "proc_syscall_surface"
AF_UNIX, AF_NETLINK = int(socket.AF_UNIX), int(socket.AF_NETLINK)
CALLS = ("io_uring_setup", "keyctl", "bpf", "ioctl-tiocsti")


def netlink(**identity: Any) -> dict[str, Any]:
    """A socket(AF_NETLINK) the payload reports created, with what it says the fd is."""
    return att("socket-netlink", "succeeded", detail="socket created and closed", **identity)


def kernels() -> dict[str, Any]:
    """A real AF_NETLINK socket's identity, as the kernel reports it."""
    return {"is_socket": True, "domain": AF_NETLINK, "type": 3, "protocol": 0}


def control() -> dict[str, Any]:
    """A host control whose unfiltered baseline reaches every call and a real netlink socket."""
    baseline = {
        "attempts": [
            att("getpid", "succeeded", "control"),
            *(att(c, "succeeded", errno="EINVAL") for c in CALLS),
            att("socket-vsock", "refused", errno="EAFNOSUPPORT"),
            netlink(**kernels()),
            att("socket-packet", "refused", errno="EPERM"),
        ]
    }
    return {"ok": True, "nonce": "h" + secrets.token_hex(4), "checks": [], "baseline": baseline}


def judged(tmp_path: Path, socket_attempt: dict[str, Any]) -> tuple[Verdict, Any]:
    """A filtered report (every raw call EPERM) with one socket(AF_NETLINK) attempt, judged."""
    ctx = make_ctx(tmp_path, PROBE, CONFINED)
    report = {
        "attempts": [
            att("getpid", "succeeded", "control"),
            *(att(c, "refused", errno="EPERM") for c in CALLS),
            att("socket-vsock", "refused", errno="EAFNOSUPPORT"),
            socket_attempt,
            att("socket-packet", "refused", errno="EPERM"),
        ],
        "facts": {"seccomp": "2"},
    }
    spec = PROBES[PROBE]
    assessment = spec.assess(ctx, report, Records(), control())
    return decide(spec.expectation(ctx.claims), assessment).verdict, assessment


class TestRecordedReports:
    def test_a_socketpair_handed_back_is_not_the_kernels(self, tmp_path: Path) -> None:
        """socket(AF_NETLINK) answered with an AF_UNIX socket reached no kernel netlink: PASS."""
        unix = {"is_socket": True, "domain": AF_UNIX, "type": 1, "protocol": 0}
        verdict, assessment = judged(tmp_path, netlink(**unix))
        assert verdict is Verdict.PASS, assessment.reasons
        assert any(
            "not the kernel's: socket-netlink returned an AF_UNIX socket" in r
            for r in assessment.reasons
        ), assessment.reasons

    def test_a_descriptor_that_is_no_socket_is_not_the_kernels(self, tmp_path: Path) -> None:
        """A pipe or eventfd handed back for socket(AF_NETLINK) is not a netlink socket either."""
        verdict, assessment = judged(tmp_path, netlink(is_socket=False, domain=None))
        assert verdict is Verdict.PASS, assessment.reasons
        assert any("returned no socket" in r for r in assessment.reasons), assessment.reasons

    def test_a_real_netlink_socket_reaches_the_kernel(self, tmp_path: Path) -> None:
        """An AF_NETLINK socket by the kernel's own SO_DOMAIN is the escape it always was."""
        verdict, assessment = judged(tmp_path, netlink(**kernels()))
        assert verdict is Verdict.FAIL, assessment.reasons
        assert "socket-netlink" in assessment.reasons[0]

    def test_an_unidentified_descriptor_is_inconclusive(self, tmp_path: Path) -> None:
        """A descriptor whose family the kernel would not say leaves netlink unknown."""
        unknown = {"is_socket": True, "domain": None, "identity_error": "getsockopt: EPERM"}
        verdict, assessment = judged(tmp_path, netlink(**unknown))
        assert verdict is Verdict.INCONCLUSIVE, assessment.reasons
        assert any("cannot tell whose descriptor" in r for r in assessment.reasons)


def payload_module() -> ModuleType:
    """The payload file loaded as a module (the host never imports it; this test does)."""
    spec = importlib.util.spec_from_file_location("payload_syscalls", probe_path(PROBE))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestPayload:
    def test_the_payload_copy_of_the_families_is_the_hosts(self) -> None:
        """probes/proc_syscall_surface.py's FAMILY_DOMAINS equals the host's."""
        tree = ast.parse(probe_path(PROBE).read_text(encoding="utf-8"))
        copies = [
            ast.literal_eval(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "FAMILY_DOMAINS" for t in node.targets)
        ]
        assert copies == [syscall_surface.FAMILY_DOMAINS]

    def test_it_identifies_a_socketpair_as_unix(self) -> None:
        """The payload's identify_fd() on a real socketpair end says AF_UNIX, not netlink."""
        left, right = socket.socketpair()
        with left, right:
            identity = payload_module().identify_fd(left.fileno())
            assert left.fileno() >= 0  # identify_fd leaves the descriptor open
        assert identity["is_socket"] is True
        assert identity["domain"] == AF_UNIX

    def test_it_identifies_a_pipe_as_no_socket(self) -> None:
        """The payload's identify_fd() on a pipe says it is no socket and has no family."""
        read_end, write_end = os.pipe()
        try:
            identity = payload_module().identify_fd(read_end)
        finally:
            os.close(read_end)
            os.close(write_end)
        assert identity["is_socket"] is False
        assert identity["domain"] is None

    def test_the_real_payload_reports_the_kernels_netlink(self, tmp_path: Path) -> None:
        """Unsandboxed here, socket(AF_NETLINK) is an AF_NETLINK socket by the kernel's word."""
        task = tmp_path / "task.json"
        task.write_text(json.dumps({"nonce": "n1", "targets": {}}))
        run = subprocess.run(
            [sys.executable, str(probe_path(PROBE)), str(task)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        report = json.loads(run.stdout.splitlines()[-1])
        by_what = {a["what"]: a for a in report["attempts"]}
        assert by_what["socket-netlink"]["outcome"] == "succeeded", by_what["socket-netlink"]
        assert by_what["socket-netlink"]["domain"] == AF_NETLINK
        assert by_what["socket-netlink"]["is_socket"] is True
