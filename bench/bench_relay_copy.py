"""Benchmark: which copy the proxy's relay should use, per kind of hop, in one run.

    python bench/bench_relay_copy.py [--mib 256] [--rounds 7]

Each leg pulls the same 256 MiB from one source process through one relay process running
the proxy's own copy functions (`buffer_copy`, `splice_copy` from world/egress/wire.py),
alternating legs round by round; medians and ratios to a direct loopback read are printed.
This backs the choice in `pump`: a growing buffer (up to `BUFFER_MAX`) for TCP -> TCP, which
is every handed-over connection, and splice when a unix socket is an end. Linux only.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_proxy import MIB, drain, source_process

from sandbox_attest.world.egress import wire

if TYPE_CHECKING:
    from multiprocessing.connection import Connection


@dataclass(frozen=True)
class Hop:
    """One relay configuration: how the reader reaches it and how it copies."""

    label: str
    unix: bool  # the reader connects over a unix socket (the proxy -> relaying shim hop)
    copy: str  # "buffer" or "splice"
    buffer_max: int = wire.BUFFER_MAX


@dataclass
class Leg:
    """A hop's address once its relay listens, and its timings."""

    hop: Hop
    address: str | tuple[str, int]
    seconds: list[float] = field(default_factory=list)


HOPS = (
    Hop("TCP->TCP buffer<=4M", unix=False, copy="buffer"),
    Hop("TCP->TCP buffer<=1M", unix=False, copy="buffer", buffer_max=MIB),
    Hop("TCP->TCP splice", unix=False, copy="splice"),
    Hop("TCP->unix buffer<=4M", unix=True, copy="buffer"),
    Hop("TCP->unix splice", unix=True, copy="splice"),
)


def relay(hop: Hop, source_port: int, unix_path: str, ready: Connection) -> None:
    """Child process: accept readers, copy the source to each with the hop's copy function."""
    wire.BUFFER_MAX = hop.buffer_max
    copy = wire.splice_copy if hop.copy == "splice" else wire.buffer_copy
    if hop.unix:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(unix_path)
        listener.listen(8)
        ready.send(unix_path)
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        ready.send(listener.getsockname())

    def serve(reader: socket.socket) -> None:
        with reader, socket.create_connection(("127.0.0.1", source_port)) as upstream:
            copy(upstream, reader, [0])

    while True:
        reader, _ = listener.accept()
        threading.Thread(target=serve, args=(reader,), daemon=True).start()


def read_through(leg: Leg, size: int) -> None:
    """Pull one transfer through a leg and record its seconds."""
    family = socket.AF_UNIX if isinstance(leg.address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.connect(leg.address)
        leg.seconds.append(drain(sock, size))


def main() -> int:
    """Start the source and one relay per hop, alternate the legs, print medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    size = args.mib * MIB
    fork = multiprocessing.get_context("fork")
    children: list[multiprocessing.process.BaseProcess] = []
    with tempfile.TemporaryDirectory() as tmp, source_process(size) as source:
        legs: list[Leg] = []
        try:
            for index, hop in enumerate(HOPS):
                parent_end, child_end = fork.Pipe()
                unix_path = str(Path(tmp) / f"relay{index}.sock")
                child = fork.Process(
                    target=relay, args=(hop, source.port, unix_path, child_end), daemon=True
                )
                child.start()
                children.append(child)
                legs.append(Leg(hop, parent_end.recv()))
            direct = Leg(Hop("direct loopback", unix=False, copy="-"), ("127.0.0.1", source.port))
            for _ in range(args.rounds):
                for leg in (direct, *legs):
                    read_through(leg, size)
        finally:
            for process in children:
                process.kill()
    direct_mbs = size / statistics.median(direct.seconds) / 1e6
    print(f"transfer {args.mib} MiB x {args.rounds} rounds, alternating (medians)")
    print(f"{'direct loopback':24}{direct_mbs:8.0f} MB/s")
    for leg in legs:
        mbs = size / statistics.median(leg.seconds) / 1e6
        print(f"{leg.hop.label:24}{mbs:8.0f} MB/s  {mbs / direct_mbs:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
