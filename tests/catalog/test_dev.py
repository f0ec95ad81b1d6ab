"""dev_access: which host devices a payload opens, read against the host's own device table.

The live tests run the real payload through the real runner against this host's /dev: on the
control leg it opens a device beyond the harmless set (the escape the probe must see), and
under bubblewrap's minimal /dev it opens none. The unit tests read hand-made reports, with
the host's real device table, through the assessor.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import Backend, DeclaredClaims
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.catalog import PROBES, probe_path
from sandbox_attest.catalog.dev import (
    CONTROL_DEVICES,
    DevAccess,
    device_nodes,
    elsewhere_nodes,
    harmless_rdev,
    open_devices,
    payload_user_devices,
    read_view,
    read_whole_view,
    sensitive,
    view_sensitive,
)
from sandbox_attest.catalog.spec import CellContext
from sandbox_attest.host import viewwalk
from sandbox_attest.host.trust import payload_user
from sandbox_attest.payload import INPUT_DIR, STAGED_TASK
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.verdict import decide
from sandbox_attest.world.core import World, start_world

CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
OPEN = DeclaredClaims(network="open", filesystem="open", ipc="open")
SPEC = DevAccess()
HERE = sensitive(payload_user_devices(payload_user()))

needs_a_sensitive_device = pytest.mark.skipif(
    not HERE, reason="no device beyond the harmless set opens for the payload user here"
)


@dataclass
class Records:
    """Empty witness records: this probe's witness is the host's device table."""

    origin: list[dict[str, Any]] = field(default_factory=list)
    dns: list[dict[str, Any]] = field(default_factory=list)
    proxy: list[dict[str, Any]] = field(default_factory=list)
    direct_tcp: list[dict[str, Any]] = field(default_factory=list)
    direct_udp: list[dict[str, Any]] = field(default_factory=list)
    daemon: list[dict[str, Any]] = field(default_factory=list)


def opened(what: str, rdev: str, role: str = "escape") -> dict[str, Any]:
    """A succeeded read-only open, as the payload reports one."""
    path = "/dev/" + what.split(":", 1)[1]
    return {
        "what": what,
        "role": role,
        "outcome": "succeeded",
        "path": path,
        "rdev": rdev,
        "kind": "char",
    }


def refused(what: str, err: str = "ENOENT") -> dict[str, Any]:
    """A refused open, as the payload reports one."""
    return {"what": what, "role": "escape", "outcome": "refused", "errno": err}


def controls() -> list[dict[str, Any]]:
    """The harmless controls opened, with this host's own device numbers."""
    nodes = device_nodes()
    return [opened(f"control:{n}", nodes[n]["rdev"], "control") for n in CONTROL_DEVICES]


def harmless_view() -> dict[str, Any]:
    """A payload view holding only the harmless class, with this host's numbers."""
    nodes = device_nodes()
    keep = (*CONTROL_DEVICES, "tty")
    return {"seen": True, "pid": os.getpid(), "nodes": {n: nodes[n] for n in keep if n in nodes}}


def cell_ctx(tmp_path: Path, *, separated: bool = True) -> CellContext:
    """A dev_access cell under a confining claim in `tmp_path` (dev_access reads no world).

    Run as the payload user, or (`separated=False`) with no trust separation at all.
    """
    return CellContext(
        probe=SPEC.id,
        backend="unit",
        nonce="n" + secrets.token_hex(8),
        world=None,  # type: ignore[arg-type]  # dev_access never reads the world
        workspace=tmp_path,
        cell_dir=tmp_path,
        claims=CONFINED,
        user=payload_user() if separated else None,
    )


def assess(
    tmp_path: Path, attempts: list[dict[str, Any]], view: dict[str, Any] | None = None
) -> tuple[str, Any]:
    """The decision for one hand-made report under a confining claim, with a real control.

    `view` stands for the host's listing of the payload's /dev (none read: not seen).
    """
    ctx = cell_ctx(tmp_path)
    control = SPEC.host_control(ctx)
    if view is not None:
        control["payload_view"] = view
    assessment = SPEC.assess(ctx, {"attempts": attempts}, Records(), control)
    return decide(SPEC.expectation(CONFINED), assessment).verdict.value, assessment


class TestHostTable:
    def test_null_is_harmless_and_kvm_is_not(self) -> None:
        """1:3 (null) and the pty slaves are harmless; 10:232 (kvm) and 1:1 (mem) are not."""
        assert harmless_rdev("1:3")
        assert harmless_rdev("136:4")
        assert not harmless_rdev("10:232")
        assert not harmless_rdev("1:1")

    def test_device_nodes_reads_this_hosts_null(self) -> None:
        """The host's /dev/null is a character device 1:3."""
        assert device_nodes()["null"] == {"kind": "char", "rdev": "1:3"}

    def test_open_devices_never_opens_a_watchdog(self) -> None:
        """The host's own scan skips watchdog nodes, whose open arms a reboot timer."""
        assert not [rel for rel in open_devices() if Path(rel).name.startswith("watchdog")]

    def test_the_harmless_class_is_not_sensitive(self) -> None:
        """The payload user's table here opens every control device, none of them sensitive."""
        table = payload_user_devices(payload_user())
        assert all(table[n]["opened"] for n in CONTROL_DEVICES), table
        assert not set(CONTROL_DEVICES) & set(sensitive(table))

    def test_registered_in_the_catalogue(self) -> None:
        """dev_access is a catalogue probe of the dev area."""
        assert PROBES["dev_access"].area == "dev"


class TestAssess:
    @needs_a_sensitive_device
    def test_an_opened_sensitive_device_fails_naming_it(self, tmp_path: Path) -> None:
        """An opened device outside the harmless class is FAIL naming its host path and the fix."""
        rel = HERE[0]
        rdev = device_nodes()[rel]["rdev"]
        verdict, assessment = assess(tmp_path, [*controls(), opened(f"dev:{rel}", rdev)])
        assert verdict == "FAIL", assessment.reasons
        assert f"the sandbox exposes /dev/{rel}" in assessment.reasons[0]
        assert f"the host's /dev/{rel}" in assessment.reasons[0]
        assert "do not bind the host's /dev" in assessment.reasons[0]

    @needs_a_sensitive_device
    def test_a_renamed_device_is_named_by_the_hosts_path(self, tmp_path: Path) -> None:
        """A sensitive device under a harmless name inside is judged by its number, not name."""
        rel = HERE[0]
        rdev = device_nodes()[rel]["rdev"]
        verdict, assessment = assess(tmp_path, [*controls(), opened("dev:tty", rdev)])
        assert verdict == "FAIL", assessment.reasons
        assert f"/dev/tty (char {rdev}" in assessment.reasons[0]
        assert f"the host's /dev/{rel}" in assessment.reasons[0]

    @needs_a_sensitive_device
    def test_every_open_refused_passes(self, tmp_path: Path) -> None:
        """Sensitive devices refused inside, controls open, host opens them: PASS."""
        attempts = [*controls(), *(refused(f"dev:{rel}") for rel in HERE), refused("dev:tty")]
        verdict, assessment = assess(tmp_path, attempts)
        assert verdict == "PASS", assessment.reasons
        assert assessment.reasons[0].startswith("no device beyond the harmless set opened")

    @needs_a_sensitive_device
    def test_a_failed_control_is_inconclusive(self, tmp_path: Path) -> None:
        """No harmless device opened inside, not even null: nothing shows it could open one."""
        attempts = [refused(f"control:{n}") for n in CONTROL_DEVICES]
        attempts += [refused(f"dev:{rel}") for rel in HERE]
        verdict, assessment = assess(tmp_path, attempts)
        assert verdict == "INCONCLUSIVE", assessment.reasons
        assert any("/dev/null must open inside" in r for r in assessment.reasons)

    @needs_a_sensitive_device
    def test_a_control_with_a_foreign_number_is_inconclusive(self, tmp_path: Path) -> None:
        """A "null" that is not the host's 1:3 shows the report is not about this host."""
        attempts = [opened("control:null", "1:1", "control"), *controls()[1:]]
        attempts += [refused(f"dev:{rel}") for rel in HERE]
        verdict, assessment = assess(tmp_path, attempts)
        assert verdict == "INCONCLUSIVE", assessment.reasons
        assert any(
            "control:null opened a device the host does not" in r for r in assessment.reasons
        )


class TestHostView:
    def test_the_host_lists_a_process_dev_through_its_root(self) -> None:
        """The host reads a live process's /dev through /proc/<pid>/root: null is 1:3."""
        view = read_view(os.getpid())
        assert view["seen"], view
        assert view["nodes"]["null"] == {"kind": "char", "rdev": "1:3"}

    def test_a_gone_process_has_no_view(self) -> None:
        """A pid with no process behind it gives no view, and says why."""
        view = read_view(2**22 + 1)
        assert not view["seen"]
        assert "cannot read" in view["why"]

    def test_the_rendezvous_reading_is_the_controls_payload_view(self, tmp_path: Path) -> None:
        """The host control carries the /dev listing the rendezvous stored under dev_access."""
        ctx = cell_ctx(tmp_path)
        ctx.host_view.update({"seen": True, SPEC.id: SPEC.at_rendezvous(ctx, os.getpid())})
        view = SPEC.host_control(ctx)["payload_view"]
        assert view["seen"], view
        assert view["nodes"]["null"] == {"kind": "char", "rdev": "1:3"}

    def test_no_rendezvous_reading_says_why(self, tmp_path: Path) -> None:
        """Without a rendezvous reading the control's view is not seen, with the host's why."""
        ctx = cell_ctx(tmp_path)
        ctx.host_view.update({"seen": False, "why": "the payload never reached the rendezvous"})
        view = SPEC.host_control(ctx)["payload_view"]
        assert view == {"seen": False, "why": "the payload never reached the rendezvous"}

    def test_harmless_view_has_nothing_sensitive(self) -> None:
        """A view of null, zero, full, random, urandom and tty holds nothing sensitive."""
        assert view_sensitive(harmless_view()) == []

    @needs_a_sensitive_device
    def test_a_harmless_view_corroborates_the_refusal(self, tmp_path: Path) -> None:
        """Refused inside, and the host sees nothing to open there: PASS, backed by the view."""
        attempts = [*controls(), *(refused(f"dev:{rel}") for rel in HERE)]
        verdict, assessment = assess(tmp_path, attempts, harmless_view())
        assert verdict == "PASS", assessment.reasons
        where = f"the payload's view as the host listed it (/proc/{os.getpid()}/root)"
        assert assessment.corroborated_by == [f"{where}: only the harmless class"]

    @needs_a_sensitive_device
    def test_a_sensitive_node_in_view_leaves_the_refusal_unbacked(self, tmp_path: Path) -> None:
        """A device the host sees in the view, refused (EACCES) inside: not corroborated."""
        rel = HERE[0]
        view = harmless_view()
        view["nodes"][rel] = device_nodes()[rel]
        attempts = [*controls(), *(refused(f"dev:{r}", "EACCES") for r in HERE)]
        verdict, assessment = assess(tmp_path, attempts, view)
        assert verdict == "PASS", assessment.reasons
        assert assessment.corroborated_by == []
        assert f"the host sees /dev/{rel} in the payload's view" in " ".join(assessment.reasons)

    @needs_a_sensitive_device
    def test_a_report_calling_a_seen_node_absent_is_inconclusive(self, tmp_path: Path) -> None:
        """ENOENT for a node the host sees in the payload's /dev: the report is not what ran."""
        rel = HERE[0]
        view = harmless_view()
        view["nodes"][rel] = device_nodes()[rel]
        attempts = [*controls(), *(refused(f"dev:{r}") for r in HERE)]
        verdict, assessment = assess(tmp_path, attempts, view)
        assert verdict == "INCONCLUSIVE", assessment.reasons
        assert assessment.escape == "disagree"
        assert "which its report calls absent (ENOENT)" in " ".join(assessment.reasons)


class TestDevicesOutsideDev:
    """Issue 26, row 4: a host device node anywhere in the view, found by the host's walk."""

    def ctx(self, tmp_path: Path) -> CellContext:
        """A confined cell whose staged task is the one `prepare` would write."""
        context = cell_ctx(tmp_path)
        (tmp_path / INPUT_DIR).mkdir()
        task = {"targets": {"control": list(CONTROL_DEVICES), "devices": [], "elsewhere": {}}}
        (tmp_path / INPUT_DIR / STAGED_TASK).write_text(json.dumps(task))
        return context

    def test_only_sensitive_nodes_outside_dev_are_kept(self) -> None:
        """/dev is the payload's own scan's; harmless numbers and watchdogs are never added."""
        nodes = {
            "/dev/fuse": {"kind": "char", "rdev": "10:229"},
            "/host/dev/fuse": {"kind": "char", "rdev": "10:229"},
            "/host/dev/null": {"kind": "char", "rdev": "1:3"},
            "/host/dev/pts/3": {"kind": "char", "rdev": "136:3"},
            "/host/dev/watchdog0": {"kind": "char", "rdev": "248:0"},
            "/srv/sda": {"kind": "block", "rdev": "8:0"},
        }
        assert set(elsewhere_nodes(nodes)) == {"/host/dev/fuse", "/srv/sda"}

    def test_nodes_elsewhere_count_as_in_view(self) -> None:
        """A node elsewhere is in the view by its inside path, beside /dev's by their names."""
        view = harmless_view()
        view["elsewhere"] = {"/host/dev/fuse": {"kind": "char", "rdev": "10:229"}}
        assert view_sensitive(view) == ["/host/dev/fuse"]

    def test_this_process_view_is_walked(self) -> None:
        """The host's own view is walked; what it finds outside /dev is keyed by inside path."""
        view = read_whole_view(os.getpid())
        assert view["seen"], view
        assert view["walk"]["seen"], view["walk"]
        assert "sockets" not in view["walk"]
        assert all(p.startswith("/") and not p.startswith("/dev/") for p in view["elsewhere"])

    def test_the_rendezvous_adds_them_to_the_task(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """What the walk found outside /dev is in the task the payload reads once released."""
        found = viewwalk.ViewWalk(os.getpid())
        found.devices = {
            "/host/dev/fuse": {"kind": "char", "rdev": "10:229"},
            "/host/dev/null": {"kind": "char", "rdev": "1:3"},
        }
        monkeypatch.setattr("sandbox_attest.catalog.dev.walk_view", lambda _pid: found)
        view = SPEC.at_rendezvous(self.ctx(tmp_path), os.getpid())
        task = json.loads((tmp_path / INPUT_DIR / STAGED_TASK).read_text())
        assert task["targets"]["elsewhere"] == {"/host/dev/fuse": "/host/dev/fuse"}
        assert view["added"] == ["dev:/host/dev/fuse"]
        assert "add_failed" not in view

    def test_the_payload_tries_each_added_path(self, tmp_path: Path) -> None:
        """The payload opens an added inside path and reports its number under dev:<path>."""
        spec = importlib.util.spec_from_file_location("payload_dev", probe_path(SPEC.id))
        assert spec is not None
        assert spec.loader is not None
        payload = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(payload)
        out: dict[str, Any] = {"attempts": [], "facts": {}}
        task = {
            "targets": {
                "control": [],
                "devices": [],
                "elsewhere": {"/elsewhere/null": "/dev/null"},
                "max_nodes": 0,
                "max_depth": 0,
            }
        }
        payload.run(task, out)
        tried = {a["what"]: a for a in out["attempts"]}
        assert tried["dev:/elsewhere/null"]["outcome"] == "succeeded"
        assert tried["dev:/elsewhere/null"]["rdev"] == "1:3"

    @needs_a_sensitive_device
    def test_an_opened_node_elsewhere_fails_naming_its_inside_path(self, tmp_path: Path) -> None:
        """Opened at /host/dev/<rel>: FAIL naming the inside path and the host's own node."""
        rel = HERE[0]
        node = device_nodes()[rel]
        inside = f"/host/dev/{rel}"
        view = harmless_view() | {"elsewhere": {inside: node}, "added": [f"dev:{inside}"]}
        attempt = opened(f"dev:{inside}", node["rdev"]) | {"path": inside}
        verdict, assessment = assess(tmp_path, [*controls(), attempt], view)
        assert verdict == "FAIL", assessment.reasons
        assert f"{inside} (char {node['rdev']}" in assessment.reasons[0]
        assert f"the host's /dev/{rel}" in assessment.reasons[0]

    @needs_a_sensitive_device
    def test_an_added_node_the_report_never_tried_is_inconclusive(self, tmp_path: Path) -> None:
        """The host added /host/dev/<rel> to the task; a report without it is not what ran."""
        rel = HERE[0]
        inside = f"/host/dev/{rel}"
        view = harmless_view() | {
            "elsewhere": {inside: device_nodes()[rel]},
            "added": [f"dev:{inside}"],
        }
        attempts = [*controls(), *(refused(f"dev:{r}") for r in HERE)]
        verdict, assessment = assess(tmp_path, attempts, view)
        assert verdict == "INCONCLUSIVE", assessment.reasons
        assert "but the report never tried them" in " ".join(assessment.reasons)


# ---------------------------------------------------------------------------------------------
# Live: the real payload, the real runner, this host's /dev.


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def live(world: World, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CellEntry]:
    """dev_access on the control leg and under bubblewrap, in one runner."""
    scratch = tmp_path_factory.mktemp("dev")
    scratch.chmod(0o755)
    backends: dict[str, Backend] = {"none": NoneBackend(), "bubblewrap": BubblewrapBackend()}
    availability = {n: b.availability() for n, b in backends.items()}
    assert all(a.ok for a in availability.values()), availability
    runner = CellRunner(
        world=world,
        scratch=scratch,
        backends=backends,
        availability=availability,
        platform="linux",
    )
    return {
        name: runner.run_cell(Cell(name, ProbeRow("dev_access", 30), None)) for name in backends
    }


@needs_a_sensitive_device
@pytest.mark.skipif(os.geteuid() != 0, reason="bubblewrap cells run as the payload user as root")
class TestLive:
    def test_control_leg_sees_the_escape(self, live: dict[str, dict[str, Any]]) -> None:
        """Unconfined, the payload opens the host's sensitive devices: the escape is seen."""
        entry = live["none"]
        assert entry["verdict"] == "PASS", entry["reason"]
        assert entry["escape"] == "escaped", entry["reason"]
        assert f"the sandbox exposes /dev/{HERE[0]}" in entry["reason"]

    def test_bubblewrap_minimal_dev_refuses_them(self, live: dict[str, dict[str, Any]]) -> None:
        """Under bubblewrap (--dev) the payload gets harmless devices only: PASS, all refused."""
        entry = live["bubblewrap"]
        assert entry["verdict"] == "PASS", entry["reason"]
        assert entry["escape"] == "refused", entry["reason"]
        named = {a["what"] for a in entry["attempts"]}
        assert {f"dev:{rel}" for rel in HERE} <= named

    def test_the_host_read_the_payloads_dev(self, live: dict[str, dict[str, Any]]) -> None:
        """The host listed the confined payload's /dev itself: harmless only, which backs it."""
        entry = live["bubblewrap"]
        view = entry["witness"]["payload_view"]
        assert view["seen"], view
        assert view_sensitive(view) == []
        assert {"null", "zero", "full", "random", "urandom"} <= set(view["nodes"])
        assert entry["corroborated_by"], entry
