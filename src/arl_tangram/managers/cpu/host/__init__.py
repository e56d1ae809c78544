"""The CPU manager's side, in the service process (asyncio): `CpuManager` and what it drives.

Runs in: the service (or NodeAgent) process, on the event loop or its worker threads.
Holds: the manager (`manager`), the warm pool and its fork-server client (`pool`, `client`,
`direct`), the action -> sandbox request (`payload`) and the SandboxFusion result (`result`),
languages, cgroups, the start-up isolation probe (`isolation`) and entering an image
(`overlay`: the manager's half; the init's half is `sandbox.imagebox`).
May import: anything of `managers.cpu` (the ground floor `config`, `wire`, `_linux`; `images`;
`zygote.server.sandbox_path`), `core`, and the standard library. Nothing here is imported by
the fork server or a sandbox (`tests/managers/cpu/test_cpu_unit.py` checks the fork server's
imports; `make lint` checks the contracts in pyproject.toml).
"""
