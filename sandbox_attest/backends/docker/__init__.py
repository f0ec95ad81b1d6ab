"""docker: each payload in a fresh container with no network, a read-only root and no privileges.

The backend speaks to the engine through the `docker` SDK (never the CLI) and confines every
container the same way, all of it recorded in the identity profile so its digest covers it:

- `network_mode="none"`: only `lo` inside, no bridge traffic at all. The only way out is the
  egress proxy's unix socket, mounted read-only and re-exposed on 127.0.0.1:SHIM_PORT by the
  stdlib shim (`sandbox_attest/world/egress/shim.py`, also mounted read-only, never copied), with
  `HTTP_PROXY`/`HTTPS_PROXY` pointing at it.
- read-only root filesystem, `cap_drop=["ALL"]`, `no-new-privileges`, a private IPC
  namespace, a non-root user.
- our seccomp profile (`seccomp`: docker's own denials as a short deny list, plus
  io_uring, keyrings, bpf, TIOCSTI and socket families other than unix/inet/inet6, which
  docker's default lets through), passed to the engine as JSON text.
- limits, declared in the claims so `resource_limits` holds the backend to them: bubblewrap's
  rlimits (fsize, nofile) as docker ulimits, and the pids cgroup limit as "forks".
- the workspace is the only writable mount (and the only writable path at all: no tmpfs).

The user. Inside, the payload runs as an unprivileged uid. When the harness itself runs as a
non-root user it is that uid (it owns the workspace already, and it cannot chown to another
one). When the harness runs as root (CI here), a container running as root would be a weaker
sandbox than the claim, so it runs as the payload user every other sandboxed command runs as
(`sandbox_attest.host.trust`), so a canary that user owns means the same in a container as under
bubblewrap; `SANDBOX_UID` (65532) only where no payload user can be had. The workspace is
chowned to that uid for the run and handed back to its owner afterwards (only entries the
sandbox uid owns, never through a symlink). Read-only inputs must be readable by that uid;
the run's notes say when they are not, and the proxy socket must be connectable by it (0666,
or group-writable: its gid is then added to the container's groups).

Deliberate weakenings (`weaken=`, for the matrix's "does the probe catch a broken sandbox"
tests) are recorded in the identity, which then carries the name `docker+weakened`.

Every container is labelled `sandbox-attest.run=<run id>` and removed after its run (on
timeout too: killed, then removed); the built image carries the run id in its tag (its id is a
content digest shared by runs, see `image`), and `close()` removes that tag and any
container left over.

The modules, by mechanism:

- `backend`: `DockerBackend`, the Backend protocol (identity, claim, availability, run, close).
- `container`: what one container is created with (`ContainerSpec`, `CONFINEMENT`) and running
  it from create to remove through an engine that may restart (`ContainerRunner`).
- `engine`: where the engine is, and its SDK and transport errors as harness errors.
- `image`: the locally built skeleton image (or a named one).
- `seccomp`: our seccomp profile.
- `stale`: the next run's sweep of containers and image tags that runs now gone left.

Nothing is re-exported here: import from the module that defines a name
(`sandbox_attest.backends.docker.backend.DockerBackend`), so that the sweep's use of `stale`
does not load the backend. `python -m sandbox_attest.backends.docker` prints the backend's
availability (`__main__`).
"""
