"""Inside a sandbox: its init (PID 1 of its PID namespace) and the children it runs code in.

Runs in: forks of the fork server (imported by it before any fork, so a sandbox imports nothing).
Holds: the init (`init`: sets the sandbox up, serves the manager's requests), the child-side
steps every child takes and the job it runs (`child`: limits, privilege drop, running Python or
an executable), the driver of running children (`proc`), children forked in advance
(`prepared`), sessions' persistent workers (`session_worker`) and the init's side of entering
an image (`imagebox`).
May import: the ground floor (`_linux`, `wire`), its own modules, and the standard library --
never ``asyncio``, threads, `host`, `images` or `zygote` (the fork server imports this package,
not the reverse). This ``__init__`` imports nothing.
"""
