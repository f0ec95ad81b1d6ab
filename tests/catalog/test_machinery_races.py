"""The machinery and race assessors, fed hand-made reports: the host's readings decide.

Each test prepares a real cell under a temp dir (as the harness's own user: no payload user),
then hands the assessor a report the payload could have forged, and checks that the host's
own reading (a canary dir held by a sandbox process, the marker in the cell dir, a lost
record, a refusal of every bind) decides the verdict, never the report alone.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
from pathlib import Path
from typing import Any, cast

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import CellContext, machinery
from sandbox_attest.catalog.machinery import (
    DIRFD_DIR,
    MACHINERY_DIR,
    FsLeakedDirfd,
    FsMachineryOverwrite,
    _marker,
)
from sandbox_attest.catalog.races import SOCKET_DIR, FsSetupRace, _refused_as_a_kind
from sandbox_attest.run.runner import inside_route
from sandbox_attest.verdict import Verdict, decide

CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
OK_CONTROL: dict[str, Any] = {"ok": True, "nonce": "hcontrol", "checks": []}


def _ctx(probe: str, base: Path) -> CellContext:
    cell_dir = base / "cell"
    (cell_dir / "workspace").mkdir(parents=True)
    cell_dir.chmod(0o755)
    return CellContext(
        probe=probe,
        backend="test",
        nonce="n" + secrets.token_hex(8),
        world=cast("Any", None),  # none of these assessors reads the world
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=CONFINED,
        route=inside_route(),
    )


def _a(
    what: str, outcome: str, role: str = "escape", err: str | None = None, detail: str = ""
) -> dict[str, Any]:
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "detail": detail}


def _append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def _verdict(spec: Any, ctx: CellContext, attempts: list[dict[str, Any]]) -> tuple[Verdict, str]:
    report = {"attempts": attempts, "facts": {}}
    decision = decide(spec.expectation(ctx.claims), spec.assess(ctx, report, None, OK_CONTROL))
    return decision.verdict, decision.reason


class TestLeakedDirfd:
    def test_a_held_canary_dir_fails_whatever_the_report_says(self, tmp_path: Path) -> None:
        """The host sees a sandbox process holding the canary dir: FAIL over a forged refusal."""
        spec = FsLeakedDirfd()
        ctx = _ctx(spec.id, tmp_path)
        spec.prepare(ctx)
        canary = (ctx.cell_dir / DIRFD_DIR).stat()
        ctx.host_view[spec.id] = {
            "seen": True,
            "dir_fds": [
                {"pid": 2, "fd": "7", "target": "x", "identity": [canary.st_dev, canary.st_ino]}
            ],
        }
        forged = [
            _a("control:openat", "succeeded", "control"),
            _a("path:canary", "refused", err="ENOENT"),
            _a("scan:descriptors", "refused", err="ENOENT"),
        ]
        verdict, reason = _verdict(spec, ctx, forged)
        assert verdict is Verdict.FAIL, reason
        assert "fd 7 of pid 2" in reason

    def test_a_lost_record_is_never_a_pass(self, tmp_path: Path) -> None:
        """Without the host's record of the canary (no prepare), a refusal proves nothing."""
        spec = FsLeakedDirfd()
        ctx = _ctx(spec.id, tmp_path)
        attempts = [
            _a("control:openat", "succeeded", "control"),
            _a("path:canary", "refused", err="ENOENT"),
            _a("scan:descriptors", "refused", err="ENOENT"),
        ]
        verdict, reason = _verdict(spec, ctx, attempts)
        assert verdict is Verdict.INCONCLUSIVE, reason
        assert "record of this cell" in reason


class TestMachineryOverwrite:
    def test_the_marker_in_the_cell_dir_fails_a_refusing_report(self, tmp_path: Path) -> None:
        """The payload's marker found in a file of the cell dir is FAIL, whatever it reported."""
        spec = FsMachineryOverwrite()
        ctx = _ctx(spec.id, tmp_path)
        spec.prepare(ctx)
        _append(ctx.workspace / "helper-copy", f"\n# {_marker(ctx.nonce)}\n")
        inputs = ctx.cell_dir / "input"
        inputs.mkdir()
        (inputs / "config.json").write_text(f"{{}}\n# {_marker(ctx.nonce)}\n")
        attempts = [
            _a("control:workspace", "succeeded", "control"),
            _a("exe:self", "refused", err="ETXTBSY"),
            *(_a(f"write:{k}", "refused", err="ENOENT") for k in ("allowlist", "config", "helper")),
            _a("write:shim", "refused", err="EACCES"),
        ]
        verdict, reason = _verdict(spec, ctx, attempts)
        assert verdict is Verdict.FAIL, reason
        assert str(inputs / "config.json") in reason

    def test_untouched_machinery_passes(self, tmp_path: Path) -> None:
        """Every copy unchanged and no marker outside the workspace: PASS."""
        spec = FsMachineryOverwrite()
        ctx = _ctx(spec.id, tmp_path)
        spec.prepare(ctx)
        _append(ctx.workspace / "helper-copy", f"\n# {_marker(ctx.nonce)}\n")
        assert (ctx.cell_dir / MACHINERY_DIR / "helper").is_file()
        attempts = [
            _a("control:workspace", "succeeded", "control"),
            _a("exe:self", "refused", err="ETXTBSY"),
            *(_a(f"write:{k}", "refused", err="ENOENT") for k in ("allowlist", "config", "helper")),
            _a("write:shim", "refused", err="EROFS"),
        ]
        verdict, reason = _verdict(spec, ctx, attempts)
        assert verdict is Verdict.PASS, reason

    def test_the_hosts_own_binary_opened_for_write_fails(self, tmp_path: Path) -> None:
        """An exe open that the host matches to its own file by identity is FAIL, unwritten."""
        spec = FsMachineryOverwrite()
        ctx = _ctx(spec.id, tmp_path)
        spec.prepare(ctx)
        _append(ctx.workspace / "helper-copy", f"\n# {_marker(ctx.nonce)}\n")
        host = Path("/usr/bin/true").resolve().stat()
        opened = _a("exe:self", "succeeded")
        opened |= {
            "target": str(Path("/usr/bin/true").resolve()),
            "identity": [host.st_dev, host.st_ino],
        }
        attempts = [
            _a("control:workspace", "succeeded", "control"),
            opened,
            *(_a(f"write:{k}", "refused", err="ENOENT") for k in ("allowlist", "config", "helper")),
            _a("write:shim", "refused", err="EROFS"),
        ]
        verdict, reason = _verdict(spec, ctx, attempts)
        assert verdict is Verdict.FAIL, reason
        assert "opened for write (exe:self)" in reason

    def test_a_scan_cut_short_decides_nothing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A cell dir too big to read whole is INCONCLUSIVE, never "no marker": PASS."""
        spec = FsMachineryOverwrite()
        ctx = _ctx(spec.id, tmp_path)
        spec.prepare(ctx)
        _append(ctx.workspace / "helper-copy", f"\n# {_marker(ctx.nonce)}\n")
        monkeypatch.setattr(machinery, "SCAN_MAX_ENTRIES", 3)
        attempts = [
            _a("control:workspace", "succeeded", "control"),
            _a("exe:self", "refused", err="ETXTBSY"),
            *(_a(f"write:{k}", "refused", err="ENOENT") for k in ("allowlist", "config", "helper")),
            _a("write:shim", "refused", err="EROFS"),
        ]
        verdict, reason = _verdict(spec, ctx, attempts)
        assert verdict is Verdict.INCONCLUSIVE, reason
        assert "the marker scan of the cell dir was cut after 3 entries" in reason

    def test_a_write_the_claim_allows_is_not_judged(self, tmp_path: Path) -> None:
        """A claim that allows writes where the copies live is not broken by a write there."""
        spec = FsMachineryOverwrite()
        ctx = dataclasses.replace(
            _ctx(spec.id, tmp_path),
            claims=DeclaredClaims(
                network="proxy",
                filesystem="workspace",
                ipc="isolated",
                writes="allow",
                write_allow=(str(tmp_path),),
            ),
        )
        spec.prepare(ctx)
        _append(ctx.workspace / "helper-copy", f"\n# {_marker(ctx.nonce)}\n")
        _append(ctx.cell_dir / MACHINERY_DIR / "config", f"\n# {_marker(ctx.nonce)}\n")
        attempts = [
            _a("control:workspace", "succeeded", "control"),
            _a("exe:self", "refused", err="ETXTBSY"),
            _a("write:allowlist", "refused", err="EACCES"),
            _a("write:config", "succeeded"),
            _a("write:helper", "refused", err="EACCES"),
            _a("write:shim", "refused", err="EROFS"),
        ]
        verdict, reason = _verdict(spec, ctx, attempts)
        assert verdict is not Verdict.FAIL, reason
        assert "not judged: " in reason


class TestSetupRace:
    def test_a_socket_left_outside_fails_a_refusing_report(self, tmp_path: Path) -> None:
        """A socket of the payload's on the host is FAIL even where the report says refused."""
        spec = FsSetupRace()
        ctx = _ctx(spec.id, tmp_path)
        targets = spec.prepare(ctx)
        # Bound through a descriptor of its dir: the cell dir under a pytest-xdist worker's
        # tmp_path is longer than AF_UNIX's 108 bytes allow.
        place = os.open(ctx.cell_dir / SOCKET_DIR, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(f"/proc/self/fd/{place}/{targets['socket_name']}")
        finally:
            os.close(place)
        attempts = [
            _a("control:socket", "succeeded", "control"),
            _a("swap:read", "refused", err="ENOENT"),
            _a("socket:bind:0", "refused", err="ENOENT"),
        ]
        verdict, reason = _verdict(spec, ctx, attempts)
        assert verdict is Verdict.FAIL, reason
        assert "a unix socket of the payload's is left on the host" in reason

    def test_every_bind_refused_by_policy_stands_for_the_control(self) -> None:
        """EPERM for the workspace's bind and every other one is a refusal of the kind."""
        inside = [_a("control:socket", "refused", "control", err="EPERM")]
        binds = [_a("socket:bind:0", "refused", err="EPERM")]
        assert _refused_as_a_kind(inside, binds) == "EPERM"

    def test_a_path_refusal_does_not_stand_for_the_control(self) -> None:
        """ENOENT is about a path: the workspace's bind must then succeed for anything to count."""
        inside = [_a("control:socket", "refused", "control", err="ENOENT")]
        binds = [_a("socket:bind:0", "refused", err="ENOENT")]
        assert _refused_as_a_kind(inside, binds) == ""

    def test_mixed_answers_do_not_stand_for_the_control(self) -> None:
        """A workspace refusal unlike the outside one is no refusal of the kind."""
        inside = [_a("control:socket", "refused", "control", err="EPERM")]
        binds = [_a("socket:bind:0", "refused", err="EACCES")]
        assert _refused_as_a_kind(inside, binds) == ""
