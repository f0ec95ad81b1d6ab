"""Availability artifacts of command wrappers (issue 27): each one reproduced, then fixed.

A correct spec must be AVAILABLE, and where something is missing the reason says what, not
"fix [run] argv": placeholders the check has no world for, a version command the payload user
cannot run, a payload with no /proc or no /dev/null.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.command.spec import SCALARS
from sandbox_attest.errors import ConfigError
from sandbox_attest.host.trust import payload_user

ARTIFACTS = Path(__file__).resolve().parents[1] / "data" / "artifacts"
HAS_BWRAP = shutil.which("bwrap") is not None


def write_spec(tmp_path: Path, body: str) -> Path:
    """A spec file in `tmp_path`."""
    path = tmp_path / "spec.toml"
    path.write_text(body)
    return path


EVERY_SCALAR = """
[backend]
name = "wrap-every-scalar"
[detect]
executables = ["sh"]
[run]
egress = "harness-tcp"
argv = ["sh", "-c", '''for v do case "$v" in --) shift; break;; "<"*">") echo "sample: $v" >&2;
  exit 3;; esac; shift; done; exec "$@"''', "wrapper", ARGS "--", "{payload}"]
[claims]
network = "proxy"
filesystem = "open"
ipc = "open"
"""


class TestPlaceholdersAtAvailability:
    def test_a_wrapper_that_checks_its_arguments_is_available(self) -> None:
        """Ports, an address and a CA bundle reach the test command well-formed.

        Before: `<proxy_port>` reached the wrapper, it refused, and the spec was UNAVAILABLE
        with "did not run a test command ... fix [run] argv".
        """
        avail = CommandBackend.from_path(ARTIFACTS / "wrap_checks_its_args.toml").availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        assert avail.identity.profile["test_command"]["started"] is True

    def test_no_placeholder_renders_as_its_sample(self, tmp_path: Path) -> None:
        """Every placeholder a cell renders has a value of its kind at availability, none `<x>`."""
        # {payload_shell} would be a second payload (a spec holds exactly one).
        names = [n for n in SCALARS if n != "payload_shell"]
        args = " ".join(f'"{{{n}}}",' for n in names)
        body = EVERY_SCALAR.replace("ARGS", args)
        avail = CommandBackend.from_path(write_spec(tmp_path, body)).availability()
        assert avail.ok, avail.reason

    def test_a_check_with_a_run_time_placeholder_is_refused_at_load(self, tmp_path: Path) -> None:
        """A `[detect] check` naming {proxy_port} is a ConfigError at load.

        It runs before any world exists: the error names the placeholders a check may use,
        and no sample value is ever rendered into its argv.
        """
        body = EVERY_SCALAR.replace("ARGS", "").replace(
            'executables = ["sh"]', 'executables = ["sh"]\ncheck = ["test", "{proxy_port}"]'
        )
        with pytest.raises(ConfigError) as info:
            CommandBackend.from_path(write_spec(tmp_path, body))
        said = str(info.value)
        assert "[detect] check[1]" in said
        assert "{proxy_port}" in said
        assert "only {spec_dir} and {harness_home}" in said


VERSION_SPEC = """
[backend]
name = "wrap-version-fails"
[detect]
executables = ["sh"]
version = ["cat", "{spec_dir}/private/VERSION"]
[run]
egress = "harness-tcp"
argv = ["sh", "-c", 'exec "$@"', "wrapper", "{payload}"]
[claims]
network = "proxy"
filesystem = "open"
ipc = "open"
"""


@pytest.mark.skipif(payload_user() is None, reason="needs root: the payload user must differ")
class TestVersionAsThePayloadUser:
    def test_unreadable_version_is_named_in_the_identity_and_the_reason(
        self, tmp_path: Path
    ) -> None:
        """A version command the payload user cannot run leaves a named gap, not `unknown`.

        Before: the identity said `unknown` and nothing said why.
        """
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        (private / "VERSION").write_text("wrapper 1.2.3\n")
        tmp_path.chmod(0o755)  # the spec itself stays readable; only private/ is not
        avail = CommandBackend.from_path(write_spec(tmp_path, VERSION_SPEC)).availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        version = avail.identity.version
        assert version.startswith("unknown: `cat "), version
        assert "exit 1" in version
        assert "Permission denied" in version
        assert "run as " in version
        assert "version is unknown" in avail.reason
        assert "[detect] version" in avail.reason

    def test_readable_version_is_recorded(self, tmp_path: Path) -> None:
        """The same spec whose file the payload user can read records the version itself."""
        private = tmp_path / "private"
        private.mkdir(mode=0o755)
        (private / "VERSION").write_text("wrapper 1.2.3\n")
        (private / "VERSION").chmod(0o644)
        tmp_path.chmod(0o755)
        avail = CommandBackend.from_path(write_spec(tmp_path, VERSION_SPEC)).availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        assert avail.identity.version == "wrapper 1.2.3"
        assert "version is unknown" not in avail.reason


@pytest.mark.skipif(not HAS_BWRAP, reason="bwrap stands in for a wrapper that hides /proc")
class TestWhatTheWrapperMustExpose:
    def test_no_proc_inside_is_named(self) -> None:
        """No /proc inside: UNAVAILABLE naming /proc and the fix, not a traceback.

        Before: "did not run a test command under its [run] argv (exit 1: ...
        FileNotFoundError ... /proc/self/status)".
        """
        avail = CommandBackend.from_path(ARTIFACTS / "wrap_no_proc.toml").availability()
        assert not avail.ok
        assert "the payload has no /proc inside" in avail.reason
        assert "--proc /proc" in avail.reason
        assert "did not run a test command" not in avail.reason

    def test_no_dev_null_inside_is_named(self) -> None:
        """No /dev/null inside: AVAILABLE, the reason names the probes that need it."""
        avail = CommandBackend.from_path(ARTIFACTS / "wrap_no_dev_null.toml").availability()
        assert avail.ok, avail.reason
        assert "cannot open /dev/null inside" in avail.reason
        assert "lifecycle_orphans" in avail.reason
