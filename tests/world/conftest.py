"""Shared fixtures for the fixture-world tests: one PKI and one set of origins per module."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.world.origins import Origins, load_hosts
from sandbox_attest.world.pki import Pki

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# Proxy variables would route the tests' own clients (pip, curl) away from loopback, and
# REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE silently override pip's --cert (requests prefers the
# environment over the session's `verify`), so the world's CA would never be consulted.
_DROPPED_VARS = (
    "http_proxy", "https_proxy", "all_proxy", "no_proxy",
    "requests_ca_bundle", "curl_ca_bundle", "ssl_cert_file", "ssl_cert_dir",
)  # fmt: skip


def _clean_env(**extra: str) -> dict[str, str]:
    """The current environment without proxy, CA-bundle or pip variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in _DROPPED_VARS and not k.startswith("PIP_")
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A PKI with a leaf for every fixture host."""
    return Pki.create(tmp_path_factory.mktemp("pki"), [h.name for h in load_hosts()])


@pytest.fixture(scope="module")
def origins(pki: Pki) -> Iterator[Origins]:
    """All four origins on loopback, stopped after the module."""
    with Origins(pki) as running:
        yield running


@pytest.fixture
def clean_env() -> Callable[..., dict[str, str]]:
    """Build a child-process environment free of proxy, CA-bundle and pip variables."""
    return _clean_env
