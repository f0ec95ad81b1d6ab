"""The claim vocabulary: `DeclaredClaims`, a spec's `[claims]`, and how the catalogue reads them.

Old specs keep their meaning (`filesystem = "workspace"` is reads and writes limited to the
workspace), every new claim parses from its TOML form into the signed identity, every mistake
is a ConfigError naming the key and the fix, and a claim not made is NOT_APPLICABLE only for
the probes that test it alone, never on the control leg. Real spec files, parsed for real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims, Identity
from sandbox_attest.backends.bubblewrap import CLAIMS as BUBBLEWRAP
from sandbox_attest.backends.command.spec_load import load_spec
from sandbox_attest.backends.none import CLAIMS as NONE
from sandbox_attest.catalog import PROBES
from sandbox_attest.claims import claims_of, expand, unclaimed
from sandbox_attest.errors import ConfigError

SPEC_HEAD = """
[backend]
name = "claims-unit"

[detect]
executables = ["env"]

[run]
egress = "harness-tcp"
argv = ["env", "{payload}"]

[claims]
"""


def spec_claims(tmp_path: Path, declared: str) -> DeclaredClaims:
    """The declared claims of a spec whose `[claims]` table is `declared`."""
    path = tmp_path / "claims-unit.toml"
    path.write_text(SPEC_HEAD + declared)
    return load_spec(path).claims


class TestDeclaredPolicy:
    def test_old_keys_keep_their_meaning(self) -> None:
        """Three old keys alone derive reads, writes, syscalls and the cut as they always meant."""
        declared = DeclaredClaims("proxy", "workspace", "isolated")
        assert (declared.reads, declared.writes, declared.syscalls, declared.network_cut) == (
            "workspace",
            "workspace",
            "filtered",
            "namespace",
        )
        assert declared.environment == "scrubbed"
        assert declared.runs_as == ""
        open_ = DeclaredClaims("open", "open", "open")
        assert (open_.reads, open_.writes, open_.syscalls, open_.network_cut) == (
            "open",
            "open",
            "open",
            None,
        )

    def test_only_the_control_leg_claims_nothing(self) -> None:
        """The none backend claims nothing; bubblewrap and an srt-like claim do not."""
        assert NONE.claims_nothing
        assert not BUBBLEWRAP.claims_nothing
        srt_like = DeclaredClaims("proxy", "workspace", "isolated", reads="open")
        assert not srt_like.claims_nothing

    def test_identity_carries_every_claim_beside_the_old_policy(self) -> None:
        """Identity.as_dict keeps `policy` in its old shape and adds `claims`."""
        identity = Identity("b", "1", "Linux", BUBBLEWRAP, {})
        data = identity.as_dict()
        assert data["policy"] == {
            "network": "proxy",
            "filesystem": "workspace",
            "ipc": "isolated",
            "limits": dict(BUBBLEWRAP.limits),
        }
        assert data["claims"] == {
            "network": "proxy",
            "reads": "workspace",
            "writes": "workspace",
            "ipc": "isolated",
            "environment": "scrubbed",
            "syscalls": "filtered",
            "network_cut": "namespace",
            "runs_as": "non-root",
        }

    @pytest.mark.parametrize(
        ("kwargs", "needle"),
        [
            ({"reads": "deny"}, 'reads = "deny" needs read_deny'),
            ({"read_deny": ("~/.ssh",)}, 'reads = "deny" needs read_deny'),
            ({"writes": "allow"}, 'writes = "allow" needs write_allow'),
            ({"network_cut": "seccomp"}, 'network = "open" claims none'),
        ],
        ids=["deny-without-list", "list-without-deny", "allow-without-list", "cut-without-net"],
    )
    def test_unjudgeable_claims_are_refused(self, kwargs: dict[str, Any], needle: str) -> None:
        """A list mode without its list (or the reverse), or a cut of no network, is refused."""
        with pytest.raises(ValueError, match=r"needs|claims none") as info:
            DeclaredClaims("open", "open", "open", **kwargs)
        assert needle in str(info.value)

    def test_claims_round_trip_through_their_json_form(self) -> None:
        """An identity's claims read back (claims_of on the dict) as the declared claims' own."""
        declared = DeclaredClaims(
            "none",
            "workspace",
            "isolated",
            reads="deny",
            read_deny=("~/.ssh",),
            writes="allow",
            write_allow=("/tmp",),
            protected=(".git/hooks",),
            environment="passthrough",
            syscalls="open",
            network_cut="seccomp",
            runs_as="1000",
        )
        assert claims_of(declared.claims()) == claims_of(declared)


class TestSpecPolicy:
    def test_old_spec_means_what_it_meant(self, tmp_path: Path) -> None:
        """network/filesystem/ipc alone parse to the same claims as the old DeclaredClaims."""
        parsed = spec_claims(
            tmp_path, 'network = "proxy"\nfilesystem = "workspace"\nipc = "isolated"\n'
        )
        assert parsed == DeclaredClaims("proxy", "workspace", "isolated")

    def test_every_new_claim_parses(self, tmp_path: Path) -> None:
        """Each new claim parses: the lists, protected paths, environment, syscalls, runs_as."""
        parsed = spec_claims(
            tmp_path,
            """network = "none"
network_cut = "seccomp"
reads = { deny = ["~/.ssh", "/etc/shadow"] }
writes = { allow = ["/tmp"] }
protected = [".bashrc", ".git/hooks"]
environment = "passthrough"
syscalls = "open"
ipc = "isolated"
runs_as = 1000
""",
        )
        assert parsed.claims() == {
            "network": "none",
            "reads": {"deny": ["~/.ssh", "/etc/shadow"]},
            "writes": {"allow": ["/tmp"]},
            "ipc": "isolated",
            "environment": "passthrough",
            "syscalls": "open",
            "network_cut": "seccomp",
            "protected": [".bashrc", ".git/hooks"],
            "runs_as": "1000",
        }
        # Writes are confined (to an allow-list), so the old shorthand says "workspace".
        assert parsed.filesystem == "workspace"

    def test_reads_override_the_shorthand_half(self, tmp_path: Path) -> None:
        """A reads key beside filesystem overrides its half: srt's and Codex's open reads."""
        parsed = spec_claims(
            tmp_path,
            'network = "proxy"\nfilesystem = "workspace"\nreads = "open"\nipc = "isolated"\n',
        )
        assert (parsed.reads, parsed.writes, parsed.filesystem) == (
            "open",
            "workspace",
            "workspace",
        )

    def test_open_writes_make_the_shorthand_open(self, tmp_path: Path) -> None:
        """With reads and writes and no filesystem, writes = "open" makes the shorthand open."""
        parsed = spec_claims(
            tmp_path, 'network = "none"\nreads = "workspace"\nwrites = "open"\nipc = "open"\n'
        )
        assert (parsed.filesystem, parsed.reads, parsed.writes) == ("open", "workspace", "open")

    @pytest.mark.parametrize(
        ("declared", "needle"),
        [
            (
                'network = "proxy"\nreads = "open"\nipc = "isolated"\n',
                "[claims] filesystem: is missing; add filesystem = ... under [claims]",
            ),
            (
                'network = "proxy"\nfilesystem = "workspace"\nipc = "isolated"\nreads = "some"\n',
                '[claims] reads: is \'some\'; choose "open", "workspace" or a table',
            ),
            (
                (
                    'network = "proxy"\nfilesystem = "workspace"\nipc = "isolated"\n'
                    'reads = { allow = ["/x"] }\n'
                ),
                "[claims] reads: a table takes the one key 'deny', got ['allow']",
            ),
            (
                (
                    'network = "proxy"\nfilesystem = "workspace"\nipc = "isolated"\n'
                    'writes = { allow = ["tmp"] }\n'
                ),
                "[claims] writes.allow: needs absolute paths or paths under the payload user's ~",
            ),
            (
                (
                    'network = "proxy"\nfilesystem = "workspace"\nipc = "isolated"\n'
                    'protected = ["../.bashrc"]\n'
                ),
                "[claims] protected: '../.bashrc' must be a path relative to the workspace",
            ),
            (
                'network = "open"\nfilesystem = "open"\nipc = "open"\nnetwork_cut = "seccomp"\n',
                '[claims] network_cut: says how a network claim is enforced, and network = "open"',
            ),
            (
                'network = "none"\nfilesystem = "open"\nipc = "open"\nnetwork_cut = "bpf"\n',
                "[claims] network_cut: is 'bpf'; choose one of ['namespace', 'seccomp'",
            ),
            (
                'network = "none"\nfilesystem = "open"\nipc = "open"\nenvironment = "some"\n',
                "[claims] environment: is 'some'; choose one of ['scrubbed', 'passthrough']",
            ),
            (
                'network = "none"\nfilesystem = "open"\nipc = "open"\nsyscalls = "strict"\n',
                "[claims] syscalls: is 'strict'; choose one of ['filtered', 'open']",
            ),
            (
                'network = "none"\nfilesystem = "open"\nipc = "open"\nruns_as = "Root User"\n',
                '[claims] runs_as: is \'Root User\'; write "non-root", "payload-user"',
            ),
        ],
        ids=[
            "filesystem-missing",
            "reads-word",
            "reads-table-key",
            "writes-relative",
            "protected-escapes",
            "cut-without-network",
            "cut-word",
            "environment-word",
            "syscalls-word",
            "runs-as-word",
        ],
    )
    def test_mistakes_name_the_key_and_the_fix(
        self, tmp_path: Path, declared: str, needle: str
    ) -> None:
        """Every bad claim is one ConfigError line naming the file, the key and the fix."""
        with pytest.raises(ConfigError) as info:
            spec_claims(tmp_path, declared)
        assert needle in str(info.value)
        assert str(info.value).startswith(str(tmp_path / "claims-unit.toml"))


class TestCatalogueReading:
    def test_paths_under_home_and_prefixes(self, tmp_path: Path) -> None:
        """A deny-list covers what is under its paths, with ~ as the payload user's home."""
        claims = claims_of(
            DeclaredClaims("proxy", "workspace", "isolated", reads="deny", read_deny=("~/.ssh",))
        )
        assert expand("~/.ssh", tmp_path) == tmp_path / ".ssh"
        assert claims.read_denied(tmp_path / ".ssh" / "id_ed25519", tmp_path)
        assert not claims.read_denied(tmp_path / ".sshx" / "k", tmp_path)
        assert not claims.read_denied(tmp_path / ".aws" / "credentials", tmp_path)

    def test_writes_allow_list_and_protected_paths(self, tmp_path: Path) -> None:
        """An allow-list frees its paths for writes; protected covers its subtree only."""
        claims = claims_of(
            DeclaredClaims(
                "proxy",
                "workspace",
                "isolated",
                writes="allow",
                write_allow=("/tmp",),
                protected=(".git/hooks",),
            )
        )
        assert not claims.write_denied(Path("/tmp/x/canary"), tmp_path)
        assert claims.write_denied(Path("/var/tmp/canary"), tmp_path)
        assert claims.protects(".git/hooks/pre-commit")
        assert not claims.protects(".git/config")

    def test_a_stand_in_policy_reads_with_the_old_defaults(self) -> None:
        """An object with only the three old attributes reads as DeclaredClaims derives them."""

        class Old:
            network = "none"
            filesystem = "workspace"
            ipc = "isolated"

        assert claims_of(Old()) == claims_of(DeclaredClaims("none", "workspace", "isolated"))

    @pytest.mark.parametrize(
        ("probe", "declared", "reason"),
        [
            (
                "fs_read_secrets",
                DeclaredClaims("proxy", "workspace", "isolated", reads="open"),
                "the backend claims open reads; fs_read_secrets tests only the reads claim",
            ),
            (
                "fs_link_escape",
                DeclaredClaims("none", "open", "isolated"),
                "the backend claims open reads and writes; fs_link_escape tests only those",
            ),
            (
                "fs_protected_in_workspace",
                DeclaredClaims("proxy", "workspace", "isolated"),
                "the backend claims no protected paths inside the workspace",
            ),
            (
                "proc_syscall_surface",
                DeclaredClaims("proxy", "workspace", "isolated", syscalls="open"),
                "the backend claims an open syscall surface",
            ),
        ],
        ids=["open-reads", "open-fs", "no-protected", "open-syscalls"],
    )
    def test_a_claim_not_made_is_not_applicable(
        self, probe: str, declared: DeclaredClaims, reason: str
    ) -> None:
        """A probe that tests one claim alone is NOT_APPLICABLE where it is not made."""
        assert unclaimed(probe, claims_of(declared)) == reason
        assert PROBES[probe].not_claimed(declared) == reason

    @pytest.mark.parametrize(
        "probe",
        ["fs_read_secrets", "fs_link_escape", "fs_protected_in_workspace", "proc_syscall_surface"],
    )
    def test_the_control_leg_is_never_not_applicable(self, probe: str) -> None:
        """The control leg claims nothing, and must still show every escape."""
        assert unclaimed(probe, claims_of(NONE)) is None

    @pytest.mark.parametrize(
        "probe", ["fs_read_secrets", "fs_link_escape", "proc_syscall_surface", "env_inheritance"]
    )
    def test_bubblewrap_makes_every_claim_these_probes_test(self, probe: str) -> None:
        """Under bubblewrap's claims no probe but the protected-paths one is NOT_APPLICABLE."""
        assert unclaimed(probe, claims_of(BUBBLEWRAP)) is None


class TestTableName:
    """`[claims]` is the table; the old `[policy]` is read for one release, never beside it."""

    BODY = 'network = "proxy"\nfilesystem = "workspace"\nipc = "isolated"\n'

    def _spec(self, tmp_path: Path, text: str) -> Path:
        path = tmp_path / "claims-unit.toml"
        path.write_text(SPEC_HEAD.replace("[claims]\n", "") + text)
        return path

    def test_claims_table_is_read_quietly(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A spec with `[claims]` parses, and nothing is said on stderr."""
        spec = load_spec(self._spec(tmp_path, "[claims]\n" + self.BODY))
        assert spec.claims == DeclaredClaims("proxy", "workspace", "isolated")
        assert capsys.readouterr().err == ""

    def test_old_policy_table_is_read_with_a_deprecation(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`[policy]` still means the claims for one release; stderr names the fix."""
        path = self._spec(tmp_path, "[policy]\n" + self.BODY)
        spec = load_spec(path)
        assert spec.claims == DeclaredClaims("proxy", "workspace", "isolated")
        err = capsys.readouterr().err
        assert str(path) in err
        assert "[policy] is deprecated" in err
        assert "rename [policy] to [claims]" in err

    def test_both_tables_are_refused_naming_the_fix(self, tmp_path: Path) -> None:
        """A spec with `[claims]` and `[policy]` is ambiguous: refused, naming the fix."""
        path = self._spec(tmp_path, "[claims]\n" + self.BODY + "\n[policy]\n" + self.BODY)
        with pytest.raises(ConfigError) as info:
            load_spec(path)
        message = str(info.value)
        assert message.startswith(f"{path}: [policy]")
        assert "both present" in message
        assert "rename [policy] to [claims]" in message
