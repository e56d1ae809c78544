"""The fork server (``python -P -m arl_tangram.managers.cpu.zygote.server FD``), run as root.

Runs in: the fork server, and (copied by fork) in every sandbox.
Holds: the server (`server`: builds the sandboxes' root once, forks sandboxes), the syscall
filter (`seccomp`) and the compiled set-up path (`_fastpath.c`, the C twin of the child-side
steps in `sandbox.child` and of `server._fork_all`/`sandbox.init.become`).
May import: the ground floor (`_linux`, `wire`), `sandbox`, and the standard library -- never
``asyncio``, threads, `host` or `images`: every module it holds is copied into every sandbox,
so each one costs page faults on every action. This ``__init__`` imports nothing.
"""
