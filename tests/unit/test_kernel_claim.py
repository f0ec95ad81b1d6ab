"""The `kernel` claim: "shared" (the host's kernel runs the payload) or "own" (issue 27, item 2).

A spec's `[claims] kernel = "own"` says the host cannot see the payload's processes (gVisor's
Sentry, a microVM): it parses into the claims, reaches the signed identity only when made,
is refused with the fix when misspelt, and takes off the table exactly the probes only a host
view of the process could judge. Real spec files, parsed for real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.backends.command.spec import CommandSpec
from sandbox_attest.backends.command.spec_claims import claim_sources
from sandbox_attest.backends.command.spec_load import load_spec
from sandbox_attest.claims import claims_of, unclaimed
from sandbox_attest.errors import ConfigError
from sandbox_attest.paths import matrix_dir

SPEC = """
[backend]
name = "kernel-unit"

[detect]
executables = ["env"]

[run]
egress = "harness-tcp"
argv = ["env", "{payload}"]

[claims]
network = "none"
filesystem = "workspace"
ipc = "isolated"
"""

HOST_VIEW_ONLY = ("proc_syscall_surface", "proc_syscall_surface_extended", "proc_new_mount_api")


def load(tmp_path: Path, extra: str = "") -> CommandSpec:
    """The spec above with `extra` lines added to its [claims]."""
    path = tmp_path / "kernel-unit.toml"
    path.write_text(SPEC + extra)
    return load_spec(path)


class TestSpecKey:
    def test_default_is_the_hosts_kernel(self, tmp_path: Path) -> None:
        """Without the key the claims are the plain ones every old spec has: a shared kernel."""
        spec = load(tmp_path)
        assert spec.claims == DeclaredClaims("none", "workspace", "isolated")
        assert claims_of(spec.claims).kernel == "shared"
        assert "kernel" not in spec.claims.claims()

    def test_own_parses_and_reaches_the_identity(self, tmp_path: Path) -> None:
        """The claim kernel = "own" is read, and the identity's claims carry it."""
        spec = load(tmp_path, 'kernel = "own"\n')
        claims = claims_of(spec.claims)
        assert claims.own_kernel
        assert spec.claims.claims()["kernel"] == "own"
        assert claims_of(spec.claims.claims()).own_kernel  # read back from the identity
        assert claims.phrase("kernel") == 'claims kernel = "own"'

    def test_a_misspelt_value_names_the_key_and_the_choices(self, tmp_path: Path) -> None:
        """A value other than shared or own is a ConfigError naming the key and both words."""
        with pytest.raises(ConfigError) as err:
            load(tmp_path, 'kernel = "gvisor"\n')
        message = err.value.diagnostics()
        assert "[claims] kernel" in message
        assert "shared" in message
        assert "own" in message

    def test_sources_name_the_line_or_the_default(self, tmp_path: Path) -> None:
        """`backends` says where the kernel claim came from: its line, or the default."""
        assert claim_sources(load(tmp_path))["kernel"].startswith('default ("shared"')
        spec = load(tmp_path, 'kernel = "own"\n')
        assert claim_sources(spec)["kernel"].endswith(f":{SPEC.count(chr(10)) + 1}")

    def test_the_gvisor_spec_claims_its_own_kernel(self) -> None:
        """matrix/backends/gvisor.toml declares kernel = "own", network none, open reads/writes."""
        claims = claims_of(load_spec(matrix_dir() / "backends" / "gvisor.toml").claims)
        assert (claims.kernel, claims.network, claims.reads, claims.writes) == (
            "own",
            "none",
            "open",
            "open",
        )


class TestUnclaimed:
    @pytest.mark.parametrize("probe", [*HOST_VIEW_ONLY, "env_inheritance", "dev_access"])
    def test_host_view_only_probes_are_not_applicable_under_an_own_kernel(
        self, tmp_path: Path, probe: str
    ) -> None:
        """A probe only a host view of the process could judge is NOT_APPLICABLE, saying why."""
        why = unclaimed(probe, claims_of(load(tmp_path, 'kernel = "own"\n').claims))
        assert why is not None
        assert 'kernel = "own"' in why

    @pytest.mark.parametrize("probe", [*HOST_VIEW_ONLY, "env_inheritance", "proc_privileges"])
    def test_a_shared_kernel_keeps_them(self, tmp_path: Path, probe: str) -> None:
        """On the host's kernel the same probes are judged as before."""
        assert unclaimed(probe, claims_of(load(tmp_path).claims)) is None

    @pytest.mark.parametrize(
        "probe", ["proc_privileges", "proc_namespace_escape", "fs_write_outside", "net_denied_host"]
    )
    def test_effect_judged_probes_stay_under_an_own_kernel(
        self, tmp_path: Path, probe: str
    ) -> None:
        """Probes the witnesses outside the sandbox judge stay on the table under kernel own."""
        assert unclaimed(probe, claims_of(load(tmp_path, 'kernel = "own"\n').claims)) is None

    def test_tunables_under_open_writes(self, tmp_path: Path) -> None:
        """proc_kernel_tunables tests only the writes claim: NOT_APPLICABLE under open writes."""
        opened = load(tmp_path, "").claims
        assert unclaimed("proc_kernel_tunables", claims_of(opened)) is None
        path = tmp_path / "open-writes.toml"
        path.write_text(SPEC.replace('filesystem = "workspace"', 'filesystem = "open"'))
        why = unclaimed("proc_kernel_tunables", claims_of(load_spec(path).claims))
        assert why is not None
        assert "open writes" in why

    def test_the_control_leg_keeps_everything(self) -> None:
        """The control leg claims nothing and must show every escape: nothing is unclaimed."""
        nothing = DeclaredClaims("open", "open", "open")
        for probe in (*HOST_VIEW_ONLY, "env_inheritance", "proc_kernel_tunables"):
            assert unclaimed(probe, claims_of(nothing)) is None
