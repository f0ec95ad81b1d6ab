"""What the backends share lives once, in sandbox_attest/backends/base.py."""

from __future__ import annotations

from sandbox_attest.backends import base, bubblewrap
from sandbox_attest.backends.command import backend as command
from sandbox_attest.backends.docker import backend as docker


def test_one_shim_path_for_every_backend() -> None:
    """bubblewrap, docker and the command backend bind the very same shim."""
    for module in (bubblewrap, docker, command):
        assert vars(module)["shim_path"] is base.shim_path, module.__name__
    assert base.shim_path().name == "shim.py"
    assert base.shim_path().is_file()


def test_in_sandbox_paths_are_defined_once() -> None:
    """The socket and shim paths inside the sandbox come from base, not per backend."""
    for module in (bubblewrap, docker):
        assert vars(module)["SANDBOX_PROXY_SOCKET"] is base.SANDBOX_PROXY_SOCKET
        assert vars(module)["SANDBOX_SHIM"] is base.SANDBOX_SHIM
    assert base.SANDBOX_PROXY_SOCKET.startswith(base.SANDBOX_RUN_DIR + "/")
