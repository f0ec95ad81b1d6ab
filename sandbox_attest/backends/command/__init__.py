"""The command-wrapper backend: attest any third-party sandbox CLI described by a spec file.

A spec (`matrix/backends/<name>.toml`) says how to find the wrapper, the argv around the
payload, the files it needs per cell, how egress reaches the world and what it claims
to enforce. The modules, each one mechanism, from the file to a cell's run:

- `spec`: the validated spec (`CommandSpec`) and the values its placeholders take per cell
  (`RenderContext`); the placeholder and list rules are in its docstring.
- `spec_fields`: one reader per key or table, each mistake a `ConfigError` naming the fix.
- `spec_claims`: `[claims]` (formerly `[policy]`), the claims the wrapper is judged against,
  and their sources.
- `spec_load`: finding a spec by name or path and loading it (`load_spec`).
- `env`: the agent's environment a wrapper starts with, and the canaries planted in it.
- `wrapper`: what a cell and the availability check share: user, PATH, cwd, env, files.
- `check`: AVAILABLE, which means a test command started under the wrapper here.
- `leftovers`: the sweep that kills what a run left behind, as soon as the wrapper exits.
- `backend`: `CommandBackend`, one `ProbeRequest` into that command line and its run.

Nothing is re-exported here: import each name from the module that owns it.
"""
