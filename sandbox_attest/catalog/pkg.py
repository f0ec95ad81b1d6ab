"""The pip-install probe, host side: a real install through the proxy."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    new_control_nonce,
)
from sandbox_attest.catalog.judging import capability_escape, conclude, expect_capability
from sandbox_attest.catalog.proxyclient import https_via_proxy
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.verdict import Assessment, Escape, Expectation


class PkgPipInstall(SpecBase):
    """A real pip install of the canary wheel from the fixture index through the proxy."""

    id = "pkg_pip_install"
    area = "pkg"
    host_readings = ("package index and file host logs",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Install (then import, only after an install) and the denied-index control."""
        del task
        return AttemptTable(
            required=attempts_of("pip-install", "pip-install-denied"),
            optional=attempts_of("import"),
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Allowed everywhere except where the backend declares no network at all."""
        return expect_capability(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The per-cell index URLs (allowed and denied hosts) and the wheel's names."""
        index = ctx.world.info.index
        return {
            "index_url": index.url_template.format(nonce=ctx.nonce),
            "denied_index_url": index.denied_url_template.format(nonce=ctx.nonce),
            "package": index.package,
            "module": index.module,
            "wheel_nonce": index.wheel_nonce,
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host follows the index page to the file host; both hosts log the fetches."""
        info, nonce = ctx.world.info, new_control_nonce()
        page = urljoin(info.index.url_template.format(nonce=nonce), f"{info.index.package}/")

        def follow() -> dict[str, Any]:
            status, body, reason = https_via_proxy(info, page, nonce)
            links = re.findall(rb'href="([^"#]+)', body)
            if status != 200 or not links:
                return host_check(
                    "host follows the index", ok=False, detail=f"{status} {reason} no links"
                )
            target = urljoin(page, links[0].decode())
            status, wheel, reason = https_via_proxy(info, target, nonce)
            return host_check(
                "host follows the index", status == 200, f"{status} {len(wheel)} bytes"
            )

        checks = [guarded_check("host follows the index", follow)]
        records = wait_for_records(
            ctx.world,
            nonce,
            lambda r: (
                {"index", "files"} <= {o.get("host") for o in entries_with_nonce(r.origin, nonce)}
            ),
        )
        hosts = {o.get("host") for o in entries_with_nonce(records.origin, nonce)}
        checks.extend(
            host_check(f"{key} host logged the host", key in hosts, str(sorted(map(str, hosts))))
            for key in ("index", "files")
        )
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Install + import printing the nonce + index and files hosts both logged = seen.

        Where no network is declared, ANY origin entry with the nonce is an escape: a fetched
        index page is traffic that must not exist, whatever became of the install.
        """
        caps = attempts_by_role(report, "capability")
        observed = observed_outcome(caps)
        reasons: list[str] = []
        if observed == "succeeded" and any(a.get("outcome") != "succeeded" for a in caps):
            observed = "refused"
            reasons.append("pip installed, but the import did not print the wheel's nonce")
        if observed == "succeeded" and len(caps) < 2:
            observed = "error"
            reasons.append("the install is reported without the import step that proves it")
        tagged = entries_with_nonce(witness.origin, ctx.nonce)
        fetched = [o for o in tagged if o.get("status") == 200]
        hosts = {str(o.get("host")) for o in fetched}
        reasons[:0] = [
            f"origins logged fetches with the nonce from {','.join(sorted(hosts)) or 'no host'}",
            f"payload: {attempts_summary(caps)}",
        ]
        if expect_capability(ctx.claims) == "denied" and tagged:
            touched = sorted(
                {f"{o.get('host')} {o.get('path')} ({o.get('status')})" for o in tagged}
            )
            reasons.append(f"no network is declared, yet origins logged the nonce: {touched[:4]}")
            escape: Escape = "escaped"
        else:
            escape = capability_escape(observed, {"index", "files"} <= hosts, reasons)
        inside = attempts_by_role(report, "control")
        inside_ok = True
        if ctx.claims.network != "none":
            # With no network there is no proxy to answer 403: the control is meaningless there.
            inside_ok = bool(inside) and all(
                a.get("outcome") == "refused" and a.get("status") == 403 for a in inside
            )
            if inside_ok:
                reasons.append("install from the denied host failed with the proxy's 403")
        return conclude(
            escape,
            observed,
            reasons,
            inside=inside,
            inside_ok=inside_ok,
            inside_failed=f"denied-host install control failed: {attempts_summary(inside)}",
            host_control=control,
            witness={"origin": tagged},
        )
