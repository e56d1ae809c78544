"""The CPU manager's side, in the service process (asyncio): `CpuManager` and what it drives.

Runs in: the service (or NodeAgent) process, on the event loop or its worker threads.
Holds: the manager (`manager`), the fork server's supervision (`supervisor`), the sessions
(`sessions`), the warm pool and its fork-server client (`pool`, `client`, `direct`), the action
-> sandbox request (`payload`; the result is `kinds.RunResult`), languages, cgroups, the
start-up isolation probe (`isolation`), entering an image (`overlay`: the manager's half; the
init's half is `sandbox.imagebox`) and shared asyncio helpers (`tasks`).
May import: anything of `managers.cpu` (the ground floor `config`, `wire`, `_linux`; `images`;
`zygote.server.sandbox_path`), `kinds`, `core`, and the standard library. Nothing here is imported by
the fork server or a sandbox (`tests/managers/cpu/test_cpu_unit.py` checks the fork server's
imports; `make lint` checks the contracts in pyproject.toml).
"""
