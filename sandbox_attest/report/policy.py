"""The release policy (matrix/policy.toml) and the gate result derived from evidence with it.

The policy names legs (platform x backend) and the probes that must PASS in each; only PASS
satisfies it. `evaluate` turns a list of evidence cells into the test-result gate
(PASSED / WARNED / FAILED) over the legs the cells cover, and `missing_legs` says which legs the
policy requires that the cells do not cover. Both signer and verifier call the same code, so
`verify` can re-derive the signed result instead of believing it.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from sandbox_attest.claims import RUNS_AS_RE, RUNS_AS_WORDS, claims_of
from sandbox_attest.errors import ConfigError
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.verdict import Verdict

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from pathlib import Path

GateResult = Literal["PASSED", "WARNED", "FAILED"]
# Set by `merge` on control cells: the leg directory that carried them (see `evaluate`).
CARRIER_KEY: Final = "_carrier"
# The unconfined control leg: it shows each probe can see its escape, and attests nothing alone.
CONTROL_BACKEND = "none"

_TOP_KEYS = frozenset({"policy", "require", "exclude"})
_POLICY_KEYS = frozenset({"name", "version"})
_REQUIRE_KEYS = frozenset({"platform", "backend", "probes", "world", "claims"})
# What a [[require]]'s `claims` may ask of a leg's backend, and the words each claim takes
# (sandbox_attest/claims.py); `runs_as` takes a user name or a uid as well. A value may list
# alternatives with "|": network = "none|proxy".
CLAIM_WORDS: Final[dict[str, tuple[str, ...]]] = {
    "network": ("open", "proxy", "none"),
    "network_cut": ("namespace", "seccomp", "proxy-only"),
    "reads": ("open", "workspace", "deny"),
    "writes": ("open", "workspace", "allow"),
    "ipc": ("open", "isolated"),
    "environment": ("scrubbed", "passthrough"),
    "syscalls": ("filtered", "open"),
    "runs_as": RUNS_AS_WORDS,
}
# Where a leg's fixture hosts may have lived (sandbox_attest/world/lab.py): a policy may require the
# lab.
WORLDS = ("lab", "loopback")
_EXCLUDE_KEYS = frozenset({"platform", "backend", "probe", "reason"})


@dataclass(frozen=True)
class Requirement:
    """Every probe in `probes` must have a PASS cell on `platform` under `backend`."""

    platform: str
    backend: str
    probes: tuple[str, ...]
    # "lab": the leg counts only if its run's world was the hermetic lab (a loopback
    # world cannot show a sandbox's whole class of escapes). None: either world.
    world: str | None = None
    # The claims the leg's backend must make, as (claim, accepted words): a backend cannot
    # pass by claiming nothing, since a probe is NOT_APPLICABLE to a claim it does not make.
    claims: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Exclusion:
    """A cell deliberately not required, with the written reason ("*" matches anything).

    Exclusions record decisions; they never lift a requirement. An exclusion that names a
    probe (not "*") which a [[require]] for a matching leg lists contradicts it, and the
    policy is refused. `probe = "*"` reads "everything this policy does not require there".
    """

    platform: str
    backend: str
    probe: str
    reason: str


@dataclass(frozen=True)
class Policy:
    """A loaded release policy; `sha256` is over the file's exact bytes."""

    path: str
    sha256: str
    name: str
    version: int
    requirements: tuple[Requirement, ...]
    excludes: tuple[Exclusion, ...]

    def legs(self) -> set[tuple[str, str]]:
        """The (platform, backend) legs the policy requires."""
        return {(r.platform, r.backend) for r in self.requirements}


def _check_keys(table: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; allowed keys are "
            f"{', '.join(sorted(allowed))} (fix the spelling or remove it)"
        )


def _string(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def _tables(data: Mapping[str, Any], key: str, path: Path) -> list[Mapping[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{path}: {key} must be an array of tables, written [[{key}]]")
    return value


def _requirement(table: Mapping[str, Any], where: str) -> Requirement:
    _check_keys(table, _REQUIRE_KEYS, where)
    probes = table.get("probes")
    if not isinstance(probes, list) or not all(isinstance(p, str) and p for p in probes):
        raise ConfigError(f"{where}: probes must be a list of probe ids")
    if not probes:
        raise ConfigError(
            f"{where}: probes is empty; a leg that requires nothing proves nothing "
            "(list its probes or delete the table)"
        )
    if len(set(probes)) != len(probes):
        raise ConfigError(f"{where}: probes lists the same probe twice")
    world = table.get("world")
    if world is not None and world not in WORLDS:
        raise ConfigError(
            f"{where}: world = {world!r} is not a world; use one of {', '.join(WORLDS)}"
        )
    return Requirement(
        _string(table, "platform", where),
        _string(table, "backend", where),
        tuple(probes),
        world,
        _claims(table.get("claims", {}), where),
    )


def _claims(table: object, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`claims = { reads = "workspace", network = "none|proxy" }`: each value a word or words."""
    example = 'claims = { reads = "workspace", network = "none|proxy" }'
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: claims must be a table, e.g. {example}")
    found = []
    for key, value in table.items():
        if key not in CLAIM_WORDS:
            raise ConfigError(
                f"{where}: claims.{key} is not a claim; use one of {', '.join(CLAIM_WORDS)}"
            )
        words = tuple(value.split("|")) if isinstance(value, str) else ()
        bad = [
            w
            for w in words
            if w
            and w not in CLAIM_WORDS[key]
            and not (key == "runs_as" and RUNS_AS_RE.fullmatch(w))
        ]
        if not words or "" in words or bad:
            raise ConfigError(
                f"{where}: claims.{key} = {value!r} names {bad or 'nothing'}; write one or more "
                f"of {', '.join(CLAIM_WORDS[key])} joined by '|' (e.g. {example})"
            )
        found.append((key, words))
    return tuple(found)


def _exclusion(table: Mapping[str, Any], where: str) -> Exclusion:
    _check_keys(table, _EXCLUDE_KEYS, where)
    return Exclusion(
        str(table.get("platform", "*")),
        str(table.get("backend", "*")),
        str(table.get("probe", "*")),
        _string(table, "reason", where),
    )


def _check_exclusions(
    excludes: Sequence[Exclusion], requirements: Sequence[Requirement], path: Path
) -> None:
    """Refuse an exclusion naming a probe a matching leg requires: which one would hold?"""
    for i, ex in enumerate(excludes, start=1):
        for req in requirements:
            if (
                ex.probe in req.probes
                and ex.platform in ("*", req.platform)
                and ex.backend in ("*", req.backend)
            ):
                raise ConfigError(
                    f"{path}, [[exclude]] #{i}: excludes {ex.probe} on {ex.platform}/"
                    f"{ex.backend}, but [[require]] for {req.platform}/{req.backend} lists it; "
                    "remove one of the two"
                )


def load_policy(path: Path) -> Policy:
    """Load and validate a policy file.

    Raises:
        ConfigError: unreadable, not TOML, an unknown key (with file, key and fix), a bad
            value, or a policy that requires nothing (which would let any run pass).
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read policy {path}: {exc.strerror}; pass the release policy with --policy"
        ) from exc
    return parse_policy(raw, path)


def parse_policy(raw: bytes, path: Path) -> Policy:
    """Validate policy bytes; `path` is where they came from (named in errors and the result).

    The signer parses the exact bytes the session handed it, never the file as it is now.

    Raises:
        ConfigError: as `load_policy`, for the bytes.
    """
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    _check_keys(data, _TOP_KEYS, str(path))
    meta = data.get("policy", {})
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: [policy] must be a table")
    _check_keys(meta, _POLICY_KEYS, f"{path}, [policy]")
    version = meta.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ConfigError(f"{path}, [policy]: version must be an integer, got {version!r}")

    requirements = [
        _requirement(t, f"{path}, [[require]] #{i}")
        for i, t in enumerate(_tables(data, "require", path), start=1)
    ]
    if not requirements:
        raise ConfigError(
            f"{path}: the policy requires nothing, so any run would pass it; add at least one "
            '[[require]] table (platform = "...", backend = "...", probes = [...])'
        )
    legs = [(r.platform, r.backend) for r in requirements]
    dupes = sorted({leg for leg in legs if legs.count(leg) > 1})
    if dupes:
        raise ConfigError(
            f"{path}: leg {dupes[0][0]}/{dupes[0][1]} has two [[require]] tables; merge them"
        )

    excludes = [
        _exclusion(t, f"{path}, [[exclude]] #{i}")
        for i, t in enumerate(_tables(data, "exclude", path), start=1)
    ]
    _check_exclusions(excludes, requirements, path)
    return Policy(
        path=str(path),
        sha256=hashlib.sha256(raw).hexdigest(),
        name=str(meta.get("name", path.stem)),
        version=version,
        requirements=tuple(requirements),
        excludes=tuple(excludes),
    )


def cell_leg(cell: CellEntry, default_platform: str) -> tuple[str, str]:
    """The (platform, backend) leg a cell belongs to."""
    platform = cell.get("platform") or default_platform
    return str(platform), str(cell.get("backend", ""))


@dataclass(frozen=True)
class Gate:
    """The gate over some cells: the result, the test lists and every reason for FAILED."""

    result: GateResult
    passed: tuple[str, ...]
    warned: tuple[str, ...]
    failed: tuple[str, ...]
    problems: tuple[str, ...]


_VERDICTS = frozenset(v.value for v in Verdict)
# A cell nothing requires with one of these verdicts WARNs the gate (an escape, an
# inconclusive or an erroring cell is shown in every report as WARNED, never as PASSED).
WARNED_VERDICTS: Final = frozenset(
    {Verdict.FAIL.value, Verdict.INCONCLUSIVE.value, Verdict.ERROR.value}
)


def _judge_cell(
    name: str, key: tuple[str, str, str], verdict: str, is_required: bool, cell: CellEntry
) -> tuple[str, str | None]:
    """Which test list a cell belongs in ("" for none) and the problem it raises, if any."""
    platform, backend, probe = key
    if verdict not in _VERDICTS:
        return "failed", f"{name} has unknown verdict {verdict!r}"
    if verdict == Verdict.PASS:
        return "passed", None
    if is_required:
        if verdict == Verdict.FAIL:
            return "failed", f"{name} is FAIL: {cell.get('reason') or 'an escape was observed'}"
        return "failed", (
            f"required probe {probe} on {platform}/{backend} is {verdict}, and only PASS "
            f"satisfies the policy ({cell.get('reason') or 'no reason recorded'})"
        )
    # Not required (a wrapper included by default, say): an escape, an inconclusive or an
    # erroring cell is shown in every report and summary as WARNED, never as PASSED.
    if verdict in WARNED_VERDICTS:
        return "warned", None
    return "", None


def required_cells(
    policy: Policy | None, present_legs: set[tuple[str, str]]
) -> set[tuple[str, str, str]]:
    """(platform, backend, probe) the policy requires in the legs present."""
    if policy is None:
        return set()
    return {
        (req.platform, req.backend, probe)
        for req in policy.requirements
        if (req.platform, req.backend) in present_legs
        for probe in req.probes
    }


def cell_required(
    cell: CellEntry, key: tuple[str, str, str], required: set[tuple[str, str, str]]
) -> bool:
    """Whether a cell is required: the policy names it, or the run marked it so.

    `key` in `required_cells`, or `"required": true` (its backend was selected or required
    by name). The gate (`evaluate`) and every view's outcome (`report.outcomes`) ask this.
    """
    return key in required or cell.get("required") is True


def _world_problems(
    policy: Policy | None,
    cells: Sequence[CellEntry],
    default_platform: str,
    world: str | None,
) -> list[str]:
    """A leg present in the cells whose requirement names a world the run did not have.

    `world` None means "not judged here" (a merge, whose legs were each verified with
    their own world); a run that did not record one passes "not recorded", which fails.
    """
    if policy is None or world is None:
        return []
    legs = {cell_leg(c, default_platform) for c in cells}
    return [
        f"leg {req.platform}/{req.backend} requires world = {req.world!r}, but the run's "
        f"world was {world}: run it as root on Linux, where the harness "
        "builds its lab (sandbox-attest run --world lab)"
        for req in policy.requirements
        if req.world is not None and (req.platform, req.backend) in legs and req.world != world
    ]


def _coverage_problems(
    required: set[tuple[str, str, str]],
    seen: set[tuple[str, str, str]],
    has_cells: bool,
    confined_judged: bool,
) -> list[str]:
    """A required cell the evidence lacks, and a run whose only judged leg is the control."""
    problems = [
        f"missing required cell {backend}-{probe} on {platform}: the policy requires it to "
        "PASS but the evidence has no such cell"
        for platform, backend, probe in required
        if (platform, backend, probe) not in seen
    ]
    if has_cells and not confined_judged:
        problems.append(
            f"no required cell of a sandbox backend was judged: the control leg "
            f"`{CONTROL_BACKEND}` alone attests nothing (require a sandbox backend in the "
            "policy, or name one with --backend)"
        )
    return problems


def evaluate(
    cells: Sequence[CellEntry],
    policy: Policy | None,
    *,
    default_platform: str,
    complete: bool = True,
    qualify: bool = False,
    world: str | None = None,
) -> Gate:
    """Derive the gate from evidence cells, over the legs those cells cover.

    Rules (fail closed): no cells, an incomplete run, a required cell that is missing or not
    PASS, or no required cell of any backend but the control `none` (nothing confined was
    attested) is FAILED. A cell is required when the policy names it or the run marked it
    `"required": true` (its backend was selected or required by name). A non-required FAIL,
    INCONCLUSIVE or ERROR cell is WARNED.
    UNAVAILABLE and NOT_APPLICABLE cells that nothing requires are listed nowhere.
    Requirements for legs absent from `cells` are not judged here: see `missing_legs`.

    Args:
        cells: evidence cells (`cell_id`, `backend`, `probe`, `platform`, `verdict`).
        policy: the release policy, or None to judge the cells alone.
        default_platform: the platform of cells that do not name one.
        complete: the evidence says the run finished.
        qualify: name tests `platform:cell_id` (merged legs from several platforms).
        world: the run's world kind ("lab", "loopback" or "not recorded"), held to every
            requirement of a leg present that names one; None skips that check.
    """
    problems: list[str] = []
    passed: list[str] = []
    warned: list[str] = []
    failed: list[str] = []
    lists = {"passed": passed, "warned": warned, "failed": failed}
    if not cells:
        problems.append("the run has zero cells; a run that tested nothing never passes")
    if not complete:
        problems.append("the evidence is marked incomplete (the run was interrupted)")
    required = required_cells(policy, {cell_leg(c, default_platform) for c in cells})
    confined_judged = False
    seen: set[tuple[str, str, str]] = set()
    seen_tagged: set[tuple[str, str, str, str]] = set()
    for cell in cells:
        platform, backend = cell_leg(cell, default_platform)
        probe = str(cell.get("probe", ""))
        cell_id = str(cell.get("cell_id") or f"{backend}-{probe}")
        # A merge tags control-leg cells with the leg that carried them: every CI leg runs
        # its own `none` control, so the same control cell legitimately appears once per leg.
        carrier = str(cell.get(CARRIER_KEY, ""))
        name = (f"{platform}:{cell_id}" if qualify else cell_id) + (
            f"@{carrier}" if carrier else ""
        )
        key = (platform, backend, probe)
        verdict = str(cell.get("verdict", ""))
        if (*key, carrier) in seen_tagged:
            problems.append(f"cell {name} appears twice in the evidence")
            failed.append(name)
            continue
        seen_tagged.add((*key, carrier))
        seen.add(key)
        is_required = cell_required(cell, key, required)
        confined_judged = confined_judged or (is_required and backend != CONTROL_BACKEND)
        bucket, problem = _judge_cell(name, key, verdict, is_required, cell)
        if bucket:
            lists[bucket].append(name)
        if problem:
            problems.append(problem)
    problems.extend(_coverage_problems(required, seen, bool(cells), confined_judged))
    problems.extend(_world_problems(policy, cells, default_platform, world))
    result: GateResult = "FAILED" if problems or failed else "WARNED" if warned else "PASSED"
    return Gate(result, tuple(passed), tuple(warned), tuple(failed), tuple(problems))


def default_platform(evidence: Mapping[str, Any]) -> str:
    """The run's platform name (`platform.system`), used for cells that do not name one."""
    platform = evidence.get("platform")
    if isinstance(platform, dict):
        return str(platform.get("system", "unknown")).lower()
    return "unknown"


def gate_for(evidence: Mapping[str, Any], policy: Policy | None) -> Gate:
    """The gate of one run's evidence under `policy` (None: the cells judged alone).

    The one place signer, renderer and verify turn evidence into a gate, so they agree.
    """
    world = evidence.get("world")
    return evaluate(
        evidence["cells"],
        policy,
        default_platform=default_platform(evidence),
        complete=evidence.get("complete") is True,
        world=str(world.get("kind")) if isinstance(world, dict) else "not recorded",
    )


def leg_claims(evidence: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each backend's claims as its signed identity records them (backend name -> claims).

    Evidence from before the claims were recorded carries only the identity's `policy`; its
    claims are then the ones those three keys always meant. A backend with no identity (it was
    UNAVAILABLE) claims nothing and is left out.
    """
    found: dict[str, dict[str, Any]] = {}
    for record in evidence.get("backends") or []:
        identity = record.get("identity") if isinstance(record, dict) else None
        if not isinstance(identity, dict):
            continue
        claims = identity.get("claims")
        if not isinstance(claims, dict):
            policy = identity.get("policy")
            claims = claims_of(policy).as_dict() if isinstance(policy, dict) else None
        if claims is not None:
            found[str(record.get("name") or identity.get("name"))] = claims
    return found


def claim_problems(
    policy: Policy, claims: Mapping[str, Mapping[str, Any]], legs: Iterable[tuple[str, str]]
) -> list[str]:
    """Every claim a present leg's requirement asks for that its backend does not make.

    Args:
        policy: the release policy.
        claims: backend name -> claims, as `leg_claims` reads them from a run's evidence.
        legs: the (platform, backend) legs the run's cells cover.

    Returns:
        One sentence per claim not made (or per leg whose backend recorded no claims).
    """
    problems = []
    present = set(legs)
    for req in policy.requirements:
        if not req.claims or (req.platform, req.backend) not in present:
            continue
        made = claims.get(req.backend)
        if made is None:
            problems.append(
                f"leg {req.platform}/{req.backend} must make claims, but the evidence records "
                f"no identity for {req.backend}, so it made none"
            )
            continue
        words = claims_of(dict(made)).words()
        for key, accepted in req.claims:
            if words.get(key) not in accepted:
                problems.append(
                    f"leg {req.platform}/{req.backend} requires claims {key} = "
                    f"{'|'.join(accepted)!r}, but {req.backend} claims {key} = "
                    f"{words.get(key) or 'nothing'!r}: a backend cannot pass by claiming less; "
                    "declare the claim in its [claims] (and hold it) or change the requirement"
                )
    return problems


def missing_legs(policy: Policy, legs: Iterable[tuple[str, str]]) -> list[str]:
    """Policy legs (as "platform/backend") that none of `legs` covers, sorted."""
    have = set(legs)
    return sorted(f"{p}/{b}" for p, b in policy.legs() - have)
