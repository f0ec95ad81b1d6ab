"""The world: the fake outside a sandbox sees, and the lab it lives in.

One package, one module per concept; nothing is imported here, so a process that needs one
piece (the egress proxy needs `dns` and `netguard`) loads only that piece:

- `core`: start and stop the whole world as one unit (`start_world`, `World`, `serve`), and
  `World.records(nonce)`, every witness log filtered to one cell;
- `lab`: the hermetic network namespaces the world lives in on Linux, and what they
  guarantee; `netguard`: the guard that refuses a send to a lab address from outside it;
- `origins`: the HTTPS/HTTP fixture hosts; `dns`: the DNS fixture; `pki`: the per-run CA;
- `listeners`: the direct-egress witnesses and the fake daemons;
- `blob`: the 18 MiB blob; `wheel`: the canary wheel; `info`: `WorldInfo`, what a probe is
  told about the world.
"""
