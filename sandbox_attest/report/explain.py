"""`sandbox-attest explain PROBE`: what a probe attempts, its control, witness, claim and fix.

The words live in one file, `probes/docs.toml`, beside the payloads they describe (and in
the wheel with them). This module reads it for three readers that must never disagree: the
`explain` command, the per-probe part of `probes/README.md` (generated here, between two
marker lines; `python -m sandbox_attest.report.explain --write-readme` rewrites it and a test fails
while it is stale), and a FAIL's reason, which gets the probe's usual fix when it names none
(`with_fix`). It judges nothing.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

from sandbox_attest.errors import ConfigError
from sandbox_attest.paths import probes_dir

DOCS_NAME: Final = "docs.toml"
FIELDS: Final = ("title", "attempts", "control", "witness", "claim", "fix")
# The generated part of probes/README.md sits between these two lines.
BEGIN: Final = (
    "<!-- BEGIN per-probe docs: generated from probes/docs.toml by "
    "`python -m sandbox_attest.report.explain --write-readme`; edit docs.toml, not this -->"
)
END: Final = "<!-- END per-probe docs -->"
# A reason already naming what to do is left as it is; any other FAIL gets the probe's fix.
FIX_MARKERS: Final = ("fix:", "; fix ")


@dataclass(frozen=True)
class ProbeDoc:
    """One probe's documentation, as `probes/docs.toml` has it. Get one from `probe_doc`."""

    id: str
    title: str
    attempts: str
    control: str
    witness: str
    claim: str
    fix: str

    def text(self, width: int = 88) -> str:
        """The `explain` text: the title line, then each field as a wrapped paragraph."""
        lines = [f"{self.id}: {self.title}", ""]
        for label, body in (
            ("attempts", self.attempts),
            ("control", self.control),
            ("witness", self.witness),
            ("judges the claim", self.claim),
            ("usual fix", self.fix),
        ):
            lines += textwrap.wrap(
                body, width, initial_indent=f"{label + ':':18}", subsequent_indent=" " * 18
            )
        return "\n".join(lines) + "\n"


def docs_path() -> Path:
    """Where the probe docs live (the clone's probes/ or the wheel's copy)."""
    return probes_dir() / DOCS_NAME


@cache
def probe_docs() -> dict[str, ProbeDoc]:
    """Every probe's documentation by id, in file order.

    Raises:
        ConfigError: the file is missing or malformed, naming the entry and the key.
    """
    path = docs_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}; reinstall sandbox-attest") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax there") from exc
    docs: dict[str, ProbeDoc] = {}
    for probe, entry in dict(data.get("probe", {})).items():
        missing = [k for k in FIELDS if not isinstance(entry.get(k), str) or not entry[k]]
        unknown = sorted(set(entry) - set(FIELDS))
        if missing or unknown:
            raise ConfigError(
                f"{path}, [probe.{probe}]: needs {', '.join(FIELDS)} as non-empty strings "
                f"(missing {missing or 'none'}, unknown {unknown or 'none'})"
            )
        docs[probe] = ProbeDoc(probe, *(" ".join(entry[k].split()) for k in FIELDS))
    return docs


def probe_doc(probe: str) -> ProbeDoc:
    """The documentation of `probe`.

    Raises:
        ConfigError: no such probe, naming the known ones (and the closest).
    """
    docs = probe_docs()
    if probe in docs:
        return docs[probe]
    import difflib  # noqa: PLC0415

    close = difflib.get_close_matches(probe, list(docs), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ConfigError(f"no probe {probe!r}; {hint}the probes are: {', '.join(docs)}")


def with_fix(probe: str, reason: str) -> str:
    """`reason` with the probe's usual fix appended, unless it already says what to do.

    For a FAIL reason: a vendor reading one line should know what to change. A probe with
    no entry in the docs leaves the reason as it is (a test keeps every probe documented).
    """
    if any(marker in reason for marker in FIX_MARKERS):
        return reason
    doc = probe_docs().get(probe)
    return f"{reason}; fix: {doc.fix}" if doc is not None else reason


def readme_section(docs: dict[str, ProbeDoc] | None = None) -> str:
    """The generated per-probe part of probes/README.md, markers included."""
    docs = probe_docs() if docs is None else docs
    out = [BEGIN, "", "## Every probe, one by one", ""]
    out.append("`sandbox-attest explain PROBE` prints the same text in a terminal.")
    for doc in docs.values():
        out += [
            "",
            f"### `{doc.id}`: {doc.title}",
            "",
            f"- **Attempts:** {doc.attempts}",
            f"- **Control:** {doc.control}",
            f"- **Witness:** {doc.witness}",
            f"- **Judges the claim:** {doc.claim}",
            f"- **Usual fix:** {doc.fix}",
        ]
    out += ["", END]
    return "\n".join(out) + "\n"


def readme_with_section(readme: str, section: str) -> str:
    """`readme` with its generated part replaced by `section` (appended when it has none)."""
    if BEGIN in readme and END in readme:
        head = readme[: readme.index(BEGIN)]
        tail = readme[readme.index(END) + len(END) :].lstrip("\n")
        return head + section + ("\n" + tail if tail else "")
    return readme.rstrip("\n") + "\n\n" + section


def cmd_explain(args: argparse.Namespace) -> int:
    """`sandbox-attest explain PROBE...`: print each probe's documentation."""
    if args.list:
        for doc in probe_docs().values():
            print(f"{doc.id:26} {doc.title}")
        return 0
    if not args.probe:
        raise ConfigError("name a probe (sandbox-attest explain net_denied_host), or --list")
    print("\n".join(probe_doc(p).text() for p in args.probe), end="")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `explain` to the CLI's subcommands."""
    parser = sub.add_parser(
        "explain",
        help="print what a probe attempts, its control, witness, claim and usual fix",
    )
    parser.add_argument("probe", nargs="*", metavar="PROBE", help="probe id (repeatable)")
    parser.add_argument("--list", action="store_true", help="list every probe with its title")
    parser.set_defaults(func=cmd_explain)


def main(argv: list[str] | None = None) -> int:
    """`python -m report.explain --write-readme`: regenerate probes/README.md's part."""
    parser = argparse.ArgumentParser(prog="python -m sandbox_attest.report.explain")
    parser.add_argument("--write-readme", action="store_true", help="rewrite probes/README.md")
    args = parser.parse_args(argv)
    readme = probes_dir() / "README.md"
    text = readme_with_section(readme.read_text(encoding="utf-8"), readme_section())
    if args.write_readme:
        readme.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
