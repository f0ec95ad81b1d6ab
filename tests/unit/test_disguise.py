"""sandbox_attest.host.disguise: one neutral vocabulary for what a wrapper sees (issue 23, part 4).

The live audit (tests/integration/test_what_a_wrapper_sees.py) shows a cell's view is clean;
these tests hold the vocabulary itself to it, check the copies that cannot import it agree,
and that no module which names a payload-visible thing spells the old name again.
"""

from __future__ import annotations

import re
from pathlib import Path

from sandbox_attest.backends import base
from sandbox_attest.catalog import (
    PROBES,
    env,
    fs,
    lifecycle,
    machinery,
    proc,
    races,
    socket_witness,
)
from sandbox_attest.host import disguise
from sandbox_attest.payload import TELLTALE_WORDS
from sandbox_attest.run import hostview, sweep
from sandbox_attest.world.wheel import load_canary_metadata

REPO = Path(__file__).resolve().parents[2]
# Everything a wrapper or its payload can see by name (the LEGACY_* names are the sweep's).
VISIBLE = {
    name: getattr(disguise, name)
    for name in disguise.__all__
    if name.isupper() and not name.startswith("LEGACY_")
}
# The modules that name something the payload can list, read or see in /proc.
NAMING_MODULES = (
    "sandbox_attest/run/hostview.py",
    "sandbox_attest/host/cellgroup.py",
    "sandbox_attest/catalog/proc/anchor.py",
    "sandbox_attest/catalog/proc/namespace.py",
    "sandbox_attest/catalog/crossproc.py",
    "sandbox_attest/catalog/tunables.py",
    "sandbox_attest/catalog/lifecycle.py",
    "sandbox_attest/catalog/socket_witness.py",
    "sandbox_attest/catalog/fs/canaries.py",
    "sandbox_attest/catalog/fs/writable.py",
    "sandbox_attest/catalog/fs/write_outside.py",
    "sandbox_attest/catalog/fs/read_secrets.py",
    "sandbox_attest/catalog/fs/protected.py",
    "sandbox_attest/catalog/fs/link_escape.py",
    "sandbox_attest/catalog/env.py",
    "sandbox_attest/catalog/handles.py",
    "sandbox_attest/catalog/machinery.py",
    "sandbox_attest/catalog/races.py",
    "sandbox_attest/host/trust.py",
    "sandbox_attest/world/wheel.py",
    "sandbox_attest/world/core.py",
    "sandbox_attest/world/origins.py",
    "sandbox_attest/world/listeners.py",
    "sandbox_attest/world/pki.py",
    "sandbox_attest/world/lab.py",
    "sandbox_attest/backends/base.py",
    "sandbox_attest/backends/bubblewrap.py",
    "sandbox_attest/backends/docker/backend.py",
    "sandbox_attest/backends/docker/container.py",
    "probes/_launch.py",
    "matrix/backends/bwrap-generic.toml",
)


def test_no_visible_name_carries_a_telltale_word_or_a_probe_id() -> None:
    """Every name the payload can see is free of the telltale words and of every probe id."""
    loud = (*TELLTALE_WORDS, "witness", "test", *PROBES)
    for name, value in VISIBLE.items():
        assert isinstance(value, str), name
        # The one allowed: the reserved fixture zone `.test` (RFC 6761), which every fixture
        # name must end in so that no real resolver answers it.
        shown = value.removesuffix(".test") if name == "DNS_NAME_SUFFIX" else value
        assert [w for w in loud if w in shown.lower()] == [], (name, value)


def test_the_harness_uses_the_vocabulary() -> None:
    """The places that name visible things take their names from sandbox_attest.host.disguise."""
    assert hostview.ready_name("n1") == f"{disguise.READY_PREFIX}n1"
    assert hostview.go_name("n1") == f"{disguise.GO_PREFIX}n1"
    assert sweep.RUN_CGROUP_PREFIX == disguise.RUN_CGROUP_PREFIX
    assert disguise.ANCHOR_MARKER.encode() == sweep.ANCHOR_MARKER
    assert lifecycle.ORPHAN_MARKER == disguise.ORPHAN_MARKER
    assert socket_witness.WITNESS_PREFIX == disguise.WITNESS_PREFIX
    assert socket_witness.ABSTRACT_PREFIX == disguise.ABSTRACT_WITNESS_PREFIX
    assert fs.CANARY_NAME == disguise.CANARY_FILE
    assert env.ENV_PREFIX == disguise.ENV_CANARY_PREFIX
    assert proc.SECRET_VAR == disguise.ANCHOR_SECRET_VAR
    assert races.CANARY_DIR == disguise.RACE_CANARY_DIR
    assert races.CANARY_FILE == disguise.CANARY_FILE
    assert machinery.DIRFD_DIR == disguise.DIRFD_CANARY_DIR
    assert machinery.DIRFD_CANARY == disguise.CANARY_FILE
    assert base.SANDBOX_RUN_DIR == disguise.SANDBOX_RUN_DIR


def test_the_launcher_and_the_payload_copies_agree() -> None:
    """probes/ cannot import the package: its copies of the names equal the constants."""
    launcher = (REPO / "probes" / "_launch.py").read_text()
    assert f'READY_PREFIX = "{disguise.READY_PREFIX}"' in launcher
    assert f'GO_PREFIX = "{disguise.GO_PREFIX}"' in launcher
    writer = (REPO / "probes" / "fs_write_outside.py").read_text()
    assert f'CANARY_FILE = "{disguise.CANARY_FILE}"' in writer
    looker = (REPO / "probes" / "proc_visibility.py").read_text()
    assert f'SECRET_VAR = "{disguise.ANCHOR_SECRET_VAR}"' in looker


# Strings in those modules that name the harness but never reach a payload, with the reason.
HOST_ONLY = {
    # The docker backend's container label and seccomp profile name are the engine's, on the
    # host: a container in its own pid namespace and without the engine's socket sees neither.
    '"sandbox-attest.cell"',
    'f"seccomp=sandbox-attest-seccomp.json#sha256:{digest}"',
    # Messages to the user who installs or runs the harness.
    '"directory others can traverse, as `sandbox-attest run` does"',
    "\"install the docker SDK: pip install 'sandbox-attest[docker]'\"",
}


def test_no_naming_module_spells_an_old_name() -> None:
    """No module that names a payload-visible thing writes `sandbox-attest` in a string."""
    for relative in NAMING_MODULES:
        text = (REPO / relative).read_text()
        # Comments and docstrings may explain the history; string literals may not.
        literals = re.findall(r"(?<![#\w])[rbf]*\"(?:[^\"\\\n]|\\.)*\"", text)
        old = [s for s in literals if disguise.LEGACY_STEM in s and s not in HOST_ONLY]
        assert old == [], (relative, old)


def test_the_sweep_knows_the_new_and_the_old_names() -> None:
    """A leftover named by this release or the one before is the sweep's; others are not."""
    nonce = "n0123456789abcdef"
    assert sweep.TMP_NAMES.match(f"{disguise.CANARY_PREFIX}{nonce}")
    assert sweep.TMP_NAMES.match(f"{disguise.LINK_PREFIX}{nonce}")
    assert sweep.TMP_NAMES.match(f"sandbox-attest-canary-{nonce}")
    assert sweep.HOME_NAMES.match(f"{disguise.HOME_CANARY_PREFIX}{nonce}")
    assert sweep.HOME_NAMES.match(f".sandbox-attest-canary-{nonce}")
    assert sweep.SECRET_NAMES.match(f"{disguise.CANARY_PREFIX}{nonce}.json")
    assert sweep.RUN_DIR_NAMES.match(f"{disguise.WITNESS_PREFIX}{nonce}.sock")
    assert sweep.RUN_DIR_NAMES.match(f".sandbox-attest-witness-{nonce}.sock")
    assert Path(disguise.SANDBOX_RUN_DIR) in sweep.RUN_DIRS
    assert Path(disguise.LEGACY_RUN_DIR) in sweep.RUN_DIRS
    assert set(sweep.RUN_CGROUP_PREFIXES) == {
        disguise.RUN_CGROUP_PREFIX,
        disguise.LEGACY_RUN_CGROUP_PREFIX,
    }
    for other in ("kiln", f"{disguise.STEM}-other-{nonce}", "cache-n1", ".kiln"):
        assert not sweep.TMP_NAMES.match(other), other
        assert not sweep.HOME_NAMES.match(other), other


def test_the_canary_wheel_is_named_neutrally() -> None:
    """The wheel the payload pip-installs by name carries no telltale word in its metadata."""
    meta = load_canary_metadata(REPO / "fixtures" / "canary_wheel")
    shown = f"{meta.name} {meta.wheel_stem} {meta.summary}"
    loud = (*TELLTALE_WORDS, "test", *PROBES)
    assert [w for w in loud if w in shown.lower()] == [], shown
    package = REPO / "fixtures" / "canary_wheel" / meta.wheel_stem / "__init__.py"
    assert [w for w in loud if w in package.read_text().lower()] == []
