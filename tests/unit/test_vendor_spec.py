"""A vendor's spec: where the probe command goes, the payload user's ids, each claim's source.

A claim is declared on a line, implied by another key, or a default, and a FAIL says which.

Real spec files written to a temporary directory and loaded for real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.command.spec import payload_ids, sample_context
from sandbox_attest.backends.command.spec_claims import claim_sources
from sandbox_attest.backends.command.spec_load import load_spec
from sandbox_attest.claims import claims_of
from sandbox_attest.errors import ConfigError
from sandbox_attest.report.claimview import claim_rows

SPEC = """
[backend]
name = "vendor-unit"

[detect]
executables = ["sh"]

[run]
egress = "harness-tcp"
argv = [{argv}]

[claims]
network = "none"
filesystem = "workspace"
ipc = "isolated"
"""


def write(tmp_path: Path, argv: str) -> Path:
    """A spec whose `[run] argv` elements are `argv` (TOML, without the brackets)."""
    path = tmp_path / "vendor-unit.toml"
    path.write_text(SPEC.format(argv=argv))
    return path


class TestPayloadPlacement:
    def test_payload_shell_alone_is_accepted(self, tmp_path: Path) -> None:
        """A spec that places the probe as {payload_shell} inside one string loads."""
        spec = load_spec(write(tmp_path, '"sh", "-c", "cd {workspace} && exec {payload_shell}"'))
        argv = sample_context().with_spec_lists(spec).render_argv(spec)
        assert argv[:2] == ["sh", "-c"]
        assert argv[2].endswith("exec <payload_shell>")

    @pytest.mark.parametrize(
        ("argv", "found"),
        [
            ('"env", "{payload}", "{payload}"', "found 2 {payload} and 0 {payload_shell}"),
            ('"sh", "-c", "exec {payload_shell}", "{payload}"', "found 1 {payload} and 1"),
            ('"sh", "-c", "{payload_shell}; {payload_shell}"', "found 0 {payload} and 2"),
            ('"env"', "found 0 {payload} and 0 {payload_shell}"),
        ],
        ids=["payload-twice", "both", "shell-twice", "neither"],
    )
    def test_the_probe_command_goes_in_exactly_once(
        self, tmp_path: Path, argv: str, found: str
    ) -> None:
        """Anything but exactly one {payload} or {payload_shell} is refused, naming both."""
        with pytest.raises(ConfigError) as info:
            load_spec(write(tmp_path, argv))
        message = str(info.value)
        assert "[run] argv" in message
        assert '"{payload}"' in message
        assert "{payload_shell}" in message
        assert "exactly one of the two" in message
        assert found in message


class TestPayloadIds:
    def test_placeholders_render(self, tmp_path: Path) -> None:
        """{payload_uid} and {payload_gid} are known placeholders a root-run engine can use."""
        spec = load_spec(
            write(tmp_path, '"env", "--user={payload_uid}:{payload_gid}", "{payload}"')
        )
        argv = sample_context().with_spec_lists(spec).render_argv(spec)
        assert argv[1] == "--user=<payload_uid>:<payload_gid>"

    @pytest.mark.parametrize(("suffix", "starts"), [("", True), ("0", False)], ids=["ids", "wrong"])
    def test_the_wrapper_sees_the_ids_it_runs_the_payload_as(
        self, tmp_path: Path, suffix: str, starts: bool
    ) -> None:
        """A wrapper's test command starts only if {payload_uid}:{payload_gid} are its own ids.

        The "wrong" case (a digit appended) is the negative control: the check can fail.
        """
        check = f'[ "$(id -u):$(id -g)" = "{{payload_uid}}{suffix}:{{payload_gid}}" ] && exec "$@"'
        # JSON strings are TOML basic strings: the shell's quotes need no hand-escaping.
        path = write(
            tmp_path, ", ".join(json.dumps(a) for a in ["sh", "-c", check, "sh", "{payload}"])
        )
        avail = CommandBackend(load_spec(path)).availability()
        assert avail.ok is starts, avail.reason

    def test_ids_without_separation_are_the_harness_own(self) -> None:
        """Where there is no payload user, the placeholders name the ids the payload runs as."""
        assert payload_ids(None) == {
            "payload_uid": str(os.geteuid()),
            "payload_gid": str(os.getegid()),
        }


class TestClaimSources:
    def test_each_claim_says_where_it_came_from(self, tmp_path: Path) -> None:
        """A written claim names its spec line; an implied one names the key it follows from."""
        path = write(tmp_path, '"env", "{payload}"')
        spec = load_spec(path)
        sources = claim_sources(spec)
        lines = path.read_text().splitlines()
        network_line = next(i for i, line in enumerate(lines, 1) if line.startswith("network ="))
        assert sources["network"] == f"{path}:{network_line}"
        assert sources["syscalls"] == 'implied by ipc = "isolated"'
        assert sources["reads"] == 'implied by filesystem = "workspace"'
        assert sources["network_cut"] == 'implied by network = "none"'
        assert sources["environment"].startswith("default")

    def test_rows_cover_every_judged_claim(self, tmp_path: Path) -> None:
        """The listing has one row per claim the probes judge, each with a source."""
        spec = load_spec(write(tmp_path, '"env", "{payload}"'))
        rows = claim_rows(spec.claims, claim_sources(spec))
        assert {r["claim"] for r in rows} == set(claims_of(spec.claims).as_dict())
        assert all(r["source"] for r in rows)

    def test_fail_wording_says_implied(self, tmp_path: Path) -> None:
        """A FAIL's claim words say the syscall claim was implied by ipc, not written."""
        spec = load_spec(write(tmp_path, '"env", "{payload}"'))
        phrase = claims_of(spec.claims).phrase("syscalls")
        assert phrase == 'claims a filtered syscall surface (implied by ipc = "isolated")'

    def test_written_claim_is_not_called_implied(self, tmp_path: Path) -> None:
        """A syscall claim the spec wrote itself is worded without "implied"."""
        path = write(tmp_path, '"env", "{payload}"')
        path.write_text(path.read_text() + 'syscalls = "filtered"\n')
        spec = load_spec(path)
        assert claims_of(spec.claims).phrase("syscalls") == "claims a filtered syscall surface"
        assert claim_sources(spec)["syscalls"].startswith(f"{path}:")

    def test_a_built_in_backend_names_its_module(self) -> None:
        """A built-in backend's written claims name the module that declares them."""
        from sandbox_attest.backends.bubblewrap import CLAIMS  # noqa: PLC0415

        rows = claim_rows(CLAIMS, None, "sandbox_attest/backends/bubblewrap.py")
        sources = {r["claim"]: r["source"] for r in rows}
        assert sources["network"] == "declared in sandbox_attest/backends/bubblewrap.py"
        assert set(sources) == set(claims_of(CLAIMS).as_dict()) | {"limits"}
