"""The payload's mounts read from mountinfo and mapped to the host's by identity (issue 26)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Final

import pytest

from sandbox_attest.catalog.added_targets import untried
from sandbox_attest.catalog.fs.exposure import (
    base_key,
    find_targets,
    mark_tried,
    mount_point_of,
    payload_may_write,
)
from sandbox_attest.catalog.fs.mount_reasons import exposure_reasons, mount_judgement
from sandbox_attest.host import mountview
from sandbox_attest.host.mountview import Mapped, Mount, MountMap, parse, parse_line
from tests.unit.test_hostview import needs_bwrap, sandboxed, wait_for

# proc(5)'s own example, and lines as bwrap leaves them.
EXAMPLE = "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
SPACED = r"40 30 254:0 /var/lib/a\040b/home /home/my\040agent rw,relatime - ext4 /dev/vda1 rw"
NO_OPTIONAL = "41 30 0:27 / /host/dev-shm rw,nosuid,nodev - tmpfs tmpfs rw,size=1024k"
MANY_OPTIONAL = (
    "42 30 254:0 /usr /usr ro,nosuid shared:1 master:2 propagate_from:3 - ext4 /dev/x ro"
)
DASH_ROOT = "43 30 254:0 /- /x-y rw - ext4 /dev/x rw"


def mount(
    point: str, device: tuple[int, int] = (254, 0), root: str = "/", rw: bool = True
) -> Mount:
    """A mount with the fields the mapping reads."""
    return Mount(
        mount_id=1,
        parent_id=0,
        device=device,
        root=root,
        mount_point=point,
        options=("rw" if rw else "ro",),
        optional=(),
        fstype="ext4",
        source="/dev/x",
        super_options=("rw",),
    )


class TestParse:
    def test_the_manual_example(self) -> None:
        """proc(5)'s example gives each field, the optional one and the superblock's options."""
        got = parse_line(EXAMPLE)
        assert (got.mount_id, got.parent_id, got.device) == (36, 35, (98, 0))
        assert (got.root, got.mount_point) == ("/mnt1", "/mnt2")
        assert got.options == ("rw", "noatime")
        assert got.optional == ("master:1",)
        assert (got.fstype, got.source, got.super_options) == (
            "ext3",
            "/dev/root",
            ("rw", "errors=continue"),
        )
        assert got.writable

    def test_octal_escapes_are_decoded(self) -> None:
        """An octal escape (backslash 040) in a root or mount point is a space."""
        got = parse_line(SPACED)
        assert got.root == "/var/lib/a b/home"
        assert got.mount_point == "/home/my agent"

    @pytest.mark.parametrize(
        ("line", "optional"),
        [(NO_OPTIONAL, ()), (MANY_OPTIONAL, ("shared:1", "master:2", "propagate_from:3"))],
        ids=["none", "three"],
    )
    def test_optional_fields_end_at_the_separator(
        self, line: str, optional: tuple[str, ...]
    ) -> None:
        """Zero or many optional fields: the type and source are the two after `-`."""
        got = parse_line(line)
        assert got.optional == optional
        assert got.fstype in {"tmpfs", "ext4"}

    def test_a_dash_in_a_path_is_not_the_separator(self) -> None:
        """The separator is looked for after the six fixed fields only."""
        got = parse_line(DASH_ROOT)
        assert (got.root, got.mount_point, got.fstype) == ("/-", "/x-y", "ext4")

    def test_read_only_by_mount_or_superblock(self) -> None:
        """A ro mount, or a rw mount of a ro superblock, writes nothing."""
        assert not parse_line(MANY_OPTIONAL).writable
        assert not parse_line("1 0 8:1 / /a rw - ext4 /dev/x ro").writable

    @pytest.mark.parametrize(
        "line",
        [
            "",
            "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 ext3 /dev/root rw",
            "1 2 3",
            "1 0 8:1 / /a rw - ext4",
        ],
        ids=["empty", "no-separator", "short", "no-source"],
    )
    def test_a_broken_line_is_refused(self, line: str) -> None:
        """A line without the separator or its fields is a ValueError."""
        with pytest.raises(ValueError, match=r"mountinfo|separator"):
            parse_line(line)

    def test_broken_lines_are_named_not_dropped(self) -> None:
        """`parse` keeps every good line and names each bad one."""
        mounts, bad = parse(f"{EXAMPLE}\ngarbage\n{NO_OPTIONAL}\n")
        assert [m.mount_id for m in mounts] == [36, 41]
        assert len(bad) == 1
        assert "garbage" in bad[0]


class TestCandidates:
    def test_host_dir_is_mount_point_plus_the_rest_of_the_root(self) -> None:
        """Inside root /var/lib/agent/home on a host mount of / at / is /var/lib/agent/home."""
        inside = mount("/home/agent", root="/var/lib/agent/home")
        host = [mount("/", root="/"), mount("/srv", device=(8, 1))]
        assert mountview.host_candidates(inside, host) == ["/var/lib/agent/home"]

    def test_a_host_bind_mount_of_a_subdir(self) -> None:
        """A host mount showing /data of the device at /srv maps root /data/x to /srv/x."""
        inside = mount("/x", device=(8, 1), root="/data/x")
        host = [
            mount("/srv", device=(8, 1), root="/data"),
            mount("/other", device=(8, 1), root="/else"),
        ]
        assert mountview.host_candidates(inside, host) == ["/srv/x"]

    def test_no_host_mount_of_the_device(self) -> None:
        """Another device gives no candidate."""
        assert mountview.host_candidates(mount("/x", device=(0, 99)), [mount("/")]) == []

    def test_a_sibling_prefix_is_not_under(self) -> None:
        """Root /data2 is not under a host mount's root /data."""
        inside = mount("/x", device=(8, 1), root="/data2")
        assert mountview.host_candidates(inside, [mount("/srv", device=(8, 1), root="/data")]) == []


def _view(tmp_path: Path) -> tuple[MountMap, Path, Path]:
    """A view of this process where `<tmp>/alias` (a link to `<tmp>/host`) is a mount of it."""
    host = tmp_path / "host"
    (host / "canary").mkdir(parents=True)
    alias = tmp_path / "alias"
    alias.symlink_to(host)
    view = MountMap(os.getpid())
    view.mapped.append(Mapped(mount(str(alias)), str(host), "host", "test"))
    return view, host, alias


class TestInsidePaths:
    def test_the_canary_is_found_at_its_inside_path(self, tmp_path: Path) -> None:
        """A host dir mounted at another point shows the canary there, same (dev, ino)."""
        view, host, alias = _view(tmp_path)
        assert view.inside_paths(str(host / "canary")) == [str(alias / "canary")]

    def test_another_object_at_the_inside_path_is_not_it(self, tmp_path: Path) -> None:
        """An inside path holding another directory (another inode) is not the canary."""
        view, host, _ = _view(tmp_path)
        other = tmp_path / "other"
        (other / "canary").mkdir(parents=True)
        view.mapped[0] = Mapped(mount(str(other)), str(host), "host", "test")
        assert view.inside_paths(str(host / "canary")) == []

    def test_the_kept_identity_decides(self, tmp_path: Path) -> None:
        """A canary replaced on the host since planting is not found by the old identity."""
        view, host, _ = _view(tmp_path)
        assert view.inside_paths(str(host / "canary"), (1, 1)) == []

    def test_a_path_covered_by_a_deeper_mount_is_not_shown(self, tmp_path: Path) -> None:
        """A deeper mount over the inside path hides the host dir there."""
        view, host, alias = _view(tmp_path)
        view.mapped.append(Mapped(mount(str(alias / "canary")), None, "own", "tmpfs"))
        assert view.inside_paths(str(host / "canary")) == []

    def test_the_host_path_itself_is_not_added(self, tmp_path: Path) -> None:
        """A mount at the host's own place adds nothing: the host path is tried anyway."""
        view = MountMap(os.getpid())
        view.mapped.append(Mapped(mount(str(tmp_path)), str(tmp_path), "host", "test"))
        (tmp_path / "c").mkdir()
        assert view.inside_paths(str(tmp_path / "c")) == []

    def test_targets_are_keyed_by_canary_and_mount_point(self, tmp_path: Path) -> None:
        """`find_targets` names each added path `<key>@<mount point>`."""
        view, host, alias = _view(tmp_path)
        added = find_targets(view, {"home": (host / "canary", None)})
        assert added == {f"home@{alias}": str(alias / "canary")}
        key = next(iter(added))
        assert (base_key(key), mount_point_of(key)) == ("home", str(alias))


class TestThisProcess:
    def test_own_mounts_map_to_themselves(self) -> None:
        """This process's mounts, against its own mountinfo, are each the host's own."""
        view = mountview.map_mounts(os.getpid())
        kinds = {m.kind for m in view.mapped}
        assert "host" in kinds
        root = next(m for m in view.mapped if m.mount.mount_point == "/")
        assert root.kind in {"host", "covered"}

    def test_without_host_mounts_nothing_maps(self) -> None:
        """Against an empty host table, anonymous devices are own and the rest unmapped."""
        view = mountview.map_mounts(os.getpid(), host_text="")
        for entry in view.mapped:
            assert entry.kind in {"own", "unmapped", "covered"}
            if entry.kind == "own":
                assert entry.mount.device[0] == 0
            if entry.kind == "unmapped" and entry.mount.device[0] != 0:
                assert "cannot see device" in entry.why

    def test_an_unreadable_process_is_named(self) -> None:
        """No such pid: no mounts, and a note saying so."""
        view = mountview.map_mounts(2**22 + 7)
        assert view.mapped == []
        assert "could not be read" in view.notes[0]


class TestJudgement:
    READING: Final[dict[str, Any]] = {
        "mounts": [{"inside": "/host/var-tmp", "host": "/var/tmp", "rw": True}],
        "added": {"var_tmp@/host/var-tmp": "/host/var-tmp/kiln-n"},
        "unmapped": [],
        "add_failed": "",
    }

    def test_an_escape_names_the_inside_path_the_host_dir_and_the_fix(self) -> None:
        """A canary changed through a mount at another path: its inside path and the fix."""
        reasons: list[str] = []
        got = mount_judgement(
            "escaped",
            self.READING,
            {"attempts": [{"what": "var_tmp@/host/var-tmp:create"}]},
            reasons,
            judged=True,
            changed=["var_tmp"],
            places={"var_tmp": "/var/tmp"},
        )
        assert got == "escaped"
        text = " ".join(reasons)
        assert "mounts the host's /var/tmp at /host/var-tmp (writable)" in text
        assert "/host/var-tmp/kiln-n" in text
        assert "fix: do not mount the host's /var/tmp into the sandbox" in text

    def test_an_untried_inside_path_cannot_pass(self) -> None:
        """The payload never tried the added path: undecided, naming it."""
        reasons: list[str] = []
        got = mount_judgement(
            "refused", self.READING, {"attempts": []}, reasons, judged=True, changed=[], places={}
        )
        assert got == "undecided"
        assert any("no attempt at the inside paths" in r for r in reasons)
        assert untried(self.READING["added"], {"attempts": []}) == ["var_tmp@/host/var-tmp"]

    def test_an_unmapped_mount_cannot_pass(self) -> None:
        """A mount the host cannot map keeps the refusal from passing, naming it."""
        reading = {"mounts": [], "unmapped": [{"inside": "/data", "why": "cannot see device 8:9"}]}
        reasons: list[str] = []
        got = mount_judgement(
            "refused", reading, {"attempts": []}, reasons, judged=True, changed=[], places={}
        )
        assert got == "undecided"
        assert any("/data (cannot see device 8:9)" in r for r in reasons)

    def test_the_open_leg_is_not_held_back(self) -> None:
        """Unjudged (the control leg): the reading is reported, the escape kept."""
        reading = {"mounts": [], "unmapped": [{"inside": "/data", "why": "x"}]}
        got = mount_judgement(
            "refused", reading, {"attempts": []}, [], judged=False, changed=[], places={}
        )
        assert got == "refused"

    def test_a_writable_host_dir_with_no_canary_cannot_pass(self) -> None:
        """A host dir the payload user may write, mounted writable, never tried: undecided."""
        reading = {
            "mounts": [],
            "exposed": [
                {
                    "inside": "/data",
                    "host": "/srv/data",
                    "payload_may_write": True,
                    "canary_tried": False,
                }
            ],
        }
        reasons: list[str] = []
        got = mount_judgement(
            "refused", reading, {"attempts": []}, reasons, judged=True, changed=[], places={}
        )
        assert got == "undecided"
        assert any("/srv/data at /data" in r for r in reasons)

    def test_a_host_dir_the_payload_user_cannot_write_is_no_blocker(self) -> None:
        """A writable mount of a dir the payload user cannot write (by mode) holds nothing back."""
        reading = {
            "mounts": [],
            "exposed": [{"inside": "/data", "host": "/srv/data", "payload_may_write": False}],
        }
        got = mount_judgement(
            "refused", reading, {"attempts": []}, [], judged=True, changed=[], places={}
        )
        assert got == "refused"


class TestPayloadMayWrite:
    @pytest.mark.parametrize(
        ("mode", "owner", "expected"),
        [
            (0o1777, (4242, 4242), True),
            (0o755, (4242, 4242), False),
            (0o755, None, True),
        ],
        ids=["sticky-world", "root-0755", "same-user"],
    )
    def test_by_mode(
        self, tmp_path: Path, mode: int, owner: tuple[int, int] | None, expected: bool
    ) -> None:
        """World-writable: yes; another user's 0755: no; the owner's own 0755: yes."""
        place = tmp_path / "place"
        place.mkdir()
        place.chmod(mode)
        assert payload_may_write(place, owner) is expected


class TestMarkTried:
    @pytest.mark.parametrize(
        ("inside", "added", "expected"),
        [
            ("/var/tmp", set(), True),
            ("/host/var-tmp", {"/host/var-tmp/kiln-n"}, True),
            ("/host/var-tmp", set(), False),
        ],
        ids=["same-path", "added", "not-tried"],
    )
    def test_a_canary_in_the_exposed_dir(
        self, inside: str, added: set[str], expected: bool
    ) -> None:
        """Tried at its host path, or at an added inside path; else the exposure is untried."""
        exposed = [{"inside": inside, "host": "/var/tmp", "payload_may_write": True}]
        got = mark_tried(exposed, [Path("/var/tmp/kiln-n"), Path("/tmp/kiln-n")], added)
        assert got[0]["canary_tried"] is expected

    def test_no_canary_in_the_dir(self) -> None:
        """A host dir holding no canary is never tried."""
        exposed = [{"inside": "/data", "host": "/srv/data", "payload_may_write": True}]
        assert mark_tried(exposed, [Path("/var/tmp/kiln-n")], set())[0]["canary_tried"] is False


class TestCovered:
    @needs_bwrap
    def test_a_mount_hidden_under_a_later_one_above_it_is_covered(self) -> None:
        """/dev/shm from a recursive bind of / under bwrap's own /dev: covered, not unmapped."""
        with sandboxed([]) as pid:
            # Once bwrap has pivoted into the sandbox's root, as at a real rendezvous.
            wait_for(
                lambda: mountview.read_text(f"/proc/{pid}/mountinfo") or "/newroot",
                lambda text: "/newroot" not in text,
            )
            view = mountview.map_mounts(pid)
        assert view.of_kind("unmapped") == [], [m.record() for m in view.of_kind("unmapped")]
        shm = [m for m in view.mapped if m.mount.mount_point == "/dev/shm"]
        if shm:  # the host has a /dev/shm mount, which the bind of / carried in
            assert {m.kind for m in shm} <= {"covered", "own", "host"}


class TestReasonsForPathsThePayloadTriesItself:
    """A canary found where the payload looks anyway (`/host/...`): no target was added."""

    MOUNTS: ClassVar[dict[str, Any]] = {
        "added": {},
        "mounts": [
            {"inside": "/host/dev", "host": "/dev", "kind": "host", "rw": True},
            {"inside": "/host/dev/shm", "host": "/dev/shm", "kind": "host", "rw": True},
            {"inside": "/dev/shm", "host": "/dev/shm", "kind": "host", "rw": True},
            {"inside": "/tmp", "host": None, "kind": "own", "rw": True},
        ],
    }

    def test_the_deepest_host_dir_names_the_inside_path(self) -> None:
        """The host's /dev/shm at /host/dev/shm, named as the mount showing the canary."""
        reasons = exposure_reasons(self.MOUNTS, ["shm"], {"shm": "/dev/shm"}, "wrote")
        assert reasons[0] == (
            "the sandbox mounts the host's /dev/shm at /host/dev/shm (writable): the canary "
            "shm (/dev/shm) is in the payload's view there"
        )
        assert len(reasons) == 2  # the reason and its fix, once

    def test_a_host_dir_at_its_own_path_adds_nothing(self) -> None:
        """Shown at its own path only, a canary is the plain reason's (no mount sentence)."""
        mounts = {"added": {}, "mounts": [self.MOUNTS["mounts"][2]]}
        assert exposure_reasons(mounts, ["shm"], {"shm": "/dev/shm"}, "wrote") == []
