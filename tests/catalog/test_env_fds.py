"""env_inheritance judges the payload's descriptors by the identity of what they hold (issue 26).

The readings here are what the host recorded (sandbox_attest/run/fdview.py) of a payload that
bwrap started holding the host's `/` as fd 7 and the payload user's home as fd 8, and of
payloads holding only what the claims allow; the host's own side is built from real stats
of temporary directories where a path has to exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox_attest.catalog import PROBES
from sandbox_attest.catalog.env import (
    FIX,
    HostObjects,
    host_devices,
    judge_descriptors,
)
from tests.catalog.test_corroboration import ctx, view

DEV = 65024
ROOT = (DEV, 2)
HOME = (DEV, 1564690)
WORKSPACE = (DEV, 777)
STDIO = {
    "0": {"dev": 6, "ino": 3, "link": "/dev/null", "type": "chr"},
    "1": {"dev": 15, "ino": 10669868, "link": "pipe:[10669868]", "type": "fifo"},
    "2": {"dev": 15, "ino": 10669869, "link": "pipe:[10669869]", "type": "fifo"},
}
# As recorded on the hole-inherited-fds leg (tests/data/identity/fds_inherited.toml).
LEAKED = {
    "7": {"dev": DEV, "ino": 2, "link": "/", "top": True, "type": "dir", "up": []},
    "8": {
        "dev": DEV,
        "ino": HOME[1],
        "link": "/var/lib/agent/home",
        "top": True,
        "type": "dir",
        "up": [[DEV, 1564674], [DEV, 399276], [DEV, 397438], [DEV, 2]],
    },
}
HOST = HostObjects(
    devices=frozenset({DEV}),
    allowed={WORKSPACE: "/tmp/ws"},
    names={ROOT: ("the host's /", "/"), HOME: ("the payload user's home", "/home/agent")},
)


def _process(pid: int, extra: dict[str, Any], **more: Any) -> dict[str, Any]:
    ids = {**STDIO, **extra}
    fds = {n: e.get("link", "") for n, e in ids.items()}
    return {"pid": pid, "fds": fds, "fd_ids": ids, **more}


class TestHostObjectsOutsideTheClaims:
    def test_the_recorded_hole_names_both_descriptors(self) -> None:
        """Descriptors 7 (the host's /) and 8 (the home) are holes, each named with its target."""
        holes, unknown = judge_descriptors([_process(12, LEAKED)], HOST)
        assert unknown == []
        phrases = [h.phrase() for h in holes]
        assert phrases == [
            (
                "fd 7 -> / (the host's /: a host directory outside the workspace and the "
                "read-only set) in host pid 12"
            ),
            (
                "fd 8 -> /var/lib/agent/home (the payload user's home /home/agent: a host "
                "directory outside the workspace and the read-only set) in host pid 12"
            ),
        ]
        assert "close every descriptor above 2" in FIX

    def test_the_shim_and_the_payload_holding_it_are_one_finding(self) -> None:
        """The same descriptor on the same object in two processes names both pids once."""
        holes, _ = judge_descriptors([_process(12, LEAKED), _process(13, LEAKED)], HOST)
        assert [h.pids for h in holes] == [("12", "13"), ("12", "13")]

    def test_an_unnamed_host_directory_is_still_a_hole(self) -> None:
        """Any host directory outside the claims counts, not only the ones the host named."""
        other = {"9": {"dev": DEV, "ino": 5, "link": "/srv", "type": "dir", "top": True}}
        holes, _ = judge_descriptors([_process(12, other)], HOST)
        assert [h.what for h in holes] == [
            "a host directory outside the workspace and the read-only set"
        ]

    def test_a_host_file_outside_the_claims_is_a_hole(self) -> None:
        """A regular file on a host filesystem, under no allowed directory, is a hole."""
        secret = {"5": {"dev": DEV, "ino": 99, "link": "/etc/shadow", "type": "reg"}}
        holes, _ = judge_descriptors([_process(12, secret)], HOST)
        assert [(h.fd, h.link) for h in holes] == [("5", "/etc/shadow")]


class TestWithinTheClaims:
    def test_only_stdio_is_nothing(self) -> None:
        """A clean payload's 0-2 (a device and pipes) decide nothing."""
        assert judge_descriptors([_process(12, {})], HOST) == ([], [])

    def test_a_directory_inside_the_workspace_is_allowed(self) -> None:
        """A directory whose climb reaches the workspace is within the claims."""
        inside = {
            "4": {
                "dev": DEV,
                "ino": 800,
                "link": "/tmp/ws/sub",
                "type": "dir",
                "top": True,
                "up": [list(WORKSPACE), [DEV, 2]],
            }
        }
        assert judge_descriptors([_process(12, inside)], HOST) == ([], [])

    def test_the_sandboxs_own_filesystem_is_not_the_hosts(self) -> None:
        """A directory on a filesystem the host does not mount (its tmpfs) is the sandbox's."""
        own = {"4": {"dev": 99, "ino": 1, "link": "/tmp", "type": "dir", "top": True, "up": []}}
        assert judge_descriptors([_process(12, own)], HOST) == ([], [])

    def test_pipes_and_sockets_are_left_to_the_harness_fd_check(self) -> None:
        """Sockets and pipes are judged by their link text elsewhere, not here."""
        sock = {"3": {"dev": 8, "ino": 4, "link": "socket:[4]", "type": "sock"}}
        assert judge_descriptors([_process(12, sock)], HOST) == ([], [])

    def test_a_file_placed_in_the_workspace_is_allowed(self) -> None:
        """A file found at its link's path, in a directory that climbs to the workspace."""
        placed = {
            "3": {
                "dev": DEV,
                "ino": 801,
                "link": "/tmp/ws/.lock",
                "type": "reg",
                "top": True,
                "up": [list(WORKSPACE), [DEV, 2]],
            }
        }
        assert judge_descriptors([_process(12, placed)], HOST) == ([], [])


class TestFilesNotPlaced:
    def test_a_file_opened_elsewhere_is_a_hole(self) -> None:
        """A host file not at its link's path in the payload's view was handed on: a hole."""
        handed = {"3": {"dev": DEV, "ino": 99, "link": "/etc/shadow", "type": "reg"}}
        handed["3"] |= {"up": [], "top": False, "why": "not at its path in the payload's view"}
        holes, unknown = judge_descriptors([_process(12, handed)], HOST)
        assert ([h.fd for h in holes], unknown) == (["3"], [])

    def test_a_deleted_file_is_unidentified(self) -> None:
        """A deleted host file cannot be placed at all: undecided, not passed, not failed."""
        gone = {"3": {"dev": DEV, "ino": 99, "link": "/tmp/ws/x (deleted)", "type": "reg"}}
        gone["3"] |= {"up": [], "top": False}
        holes, unknown = judge_descriptors([_process(12, gone)], HOST)
        assert (holes, [u.fd for u in unknown]) == ([], ["3"])


class TestUnidentified:
    def test_an_unread_descriptor_is_named_not_passed(self) -> None:
        """A descriptor the host could not stat is an unidentified finding, never dropped."""
        odd = {"6": {"link": "/x", "unread": "EACCES"}}
        holes, unknown = judge_descriptors([_process(12, odd)], HOST)
        assert holes == []
        assert [u.phrase() for u in unknown] == [
            "fd 6 -> /x (the host could not identify it: EACCES) in host pid 12"
        ]

    def test_a_reading_without_identities_is_unidentified(self) -> None:
        """Extra descriptors with no identities read (an older reading) are not passed."""
        process = {"pid": 12, "fds": {"0": "/dev/null", "7": "/"}}
        holes, unknown = judge_descriptors([process], HOST)
        assert (holes, [u.fd for u in unknown]) == ([], ["*"])

    def test_an_unlistable_table_is_unidentified_but_a_gone_process_is_not(self) -> None:
        """EACCES on the table leaves it unknown; a process that exited holds nothing."""
        refused = {"pid": 12, "fds": {"error": "Permission denied"}, "fd_ids": {}}
        gone = {"pid": 13, "fds": {"error": "No such file or directory"}, "fd_ids": {}}
        holes, unknown = judge_descriptors([refused, gone], HOST)
        assert (holes, [u.pids for u in unknown]) == ([], [("12",)])

    def test_a_climb_cut_short_is_unidentified(self) -> None:
        """A host directory whose climb stopped before the top cannot be placed."""
        deep = {"4": {"dev": DEV, "ino": 5, "link": "/a", "type": "dir", "top": False}}
        holes, unknown = judge_descriptors([_process(12, deep)], HOST)
        assert holes == []
        assert "could not place" in unknown[0].what

    def test_no_host_devices_read_leaves_directories_unidentified(self) -> None:
        """Without the host's own filesystems nothing is compared, and nothing passes."""
        host = HostObjects(devices=None)
        holes, unknown = judge_descriptors([_process(12, LEAKED)], host)
        assert holes == []
        assert [u.fd for u in unknown] == ["7", "8"]


class TestHostSide:
    def test_the_hosts_devices_include_its_root_and_tmp(self, tmp_path: Path) -> None:
        """The host's filesystems, by st_dev, cover / and the test's temp dir."""
        devices = host_devices()
        assert devices is not None
        assert Path("/").stat().st_dev in devices
        assert tmp_path.stat().st_dev in devices

    def test_an_unreadable_mount_table_is_none(self, tmp_path: Path) -> None:
        """No mount table, no comparison (None), never an empty set that passes everything."""
        assert host_devices(tmp_path / "missing") is None


CONTROL = {"ok": True, "nonce": "h", "checks": [], "baseline": {}}
# The payload's own word: nothing beyond 0-2 (a wrapper can rewrite it; the host decides).
REFUSED = {
    "attempts": [{"what": "fds", "role": "escape", "outcome": "refused", "targets": {}}],
    "facts": {"env": {}},
}


class TestAssess:
    def test_a_member_holding_the_hosts_root_fails_the_cell(self, tmp_path: Path) -> None:
        """Whatever the payload reports, the host's / held by a judged member is a FAIL."""
        st = Path("/").stat()
        root = {"7": {"dev": st.st_dev, "ino": st.st_ino, "link": "/", "type": "dir"}}
        root["7"] |= {"top": True, "up": []}
        member = _process(5150, root, comm="python3", status={"Uid": "1 1 1 1"})
        spec = PROBES["env_inheritance"]
        cell = ctx(tmp_path, spec.id, view() | {"others": [member]})
        assert spec.corroboration(cell, {}) == []
        reading = spec.assess(cell, REFUSED, None, CONTROL)  # type: ignore[arg-type]
        assert reading.escape == "escaped"
        text = " ".join(reading.reasons)
        assert "fd 7 -> / (the host's /: a host directory outside the workspace" in text
        assert "in host pid 5150" in text
        assert FIX in text

    def test_an_unidentified_descriptor_is_undecided_not_pass(self, tmp_path: Path) -> None:
        """Extra descriptors the host could not identify make the cell undecided."""
        member = {"pid": 5151, "comm": "python3", "status": {"Uid": "1 1 1 1"}}
        member["fds"] = {"0": "/dev/null", "7": "/"}
        spec = PROBES["env_inheritance"]
        cell = ctx(tmp_path, spec.id, view() | {"others": [member]})
        reading = spec.assess(cell, REFUSED, None, CONTROL)  # type: ignore[arg-type]
        assert reading.escape == "undecided"
        assert "descriptors the host could not identify" in " ".join(reading.reasons)
