"""The errors the harness raises on purpose, each able to say what to do next."""

from __future__ import annotations


class HarnessError(Exception):
    """Base for every error the harness raises on purpose."""

    def diagnostics(self) -> str:
        """What happened and what to do next; the CLI prints this (sigstore's pattern)."""
        return str(self)


class ConfigError(HarnessError):
    """Bad matrix, policy, backend spec, allowlist or option: the user can fix the input."""


class FixtureError(HarnessError):
    """A fixture of the outside world (proxy, DNS, origin, PKI) failed to start or answer."""


class BackendError(HarnessError):
    """A backend failed while running a probe; subclasses wrap bwrap/Docker/OS errors."""


class BackendUnavailable(BackendError):  # noqa: N818  (the name says "can't run here", by design)
    """The backend cannot run on this machine; the message names the fix."""


class ProbeOutputError(HarnessError):
    """A probe broke its contract: no start marker, no JSON line, or a malformed one."""


class SignatureError(HarnessError):
    """An attestation does not verify."""


class ReportError(HarnessError):
    """A report directory or one of its files is missing, truncated or malformed."""
