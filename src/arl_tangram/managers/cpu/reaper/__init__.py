"""The reaper (``python -P -m arl_tangram.managers.cpu.reaper.server FD PID``), run as root.

Runs in: one small process per CPU manager, started by it, in a session of its own.
Holds: the server (`server`): it watches the service (a pidfd) and, when the service dies
(kill -9 included) or the manager closes, thaws and kills whatever is left in the manager's
cgroups, removes them and the manager's layer files, then exits; meanwhile it is the parent of
the manager's fork server and a child subreaper, so sessions orphaned by a dead fork server are
its children, not the fork server's fate (issue 41, items 4 and 6).
May import: the ground floor (`_linux`) and the standard library -- never ``asyncio``, `host`,
`images`, `zygote` or `sandbox`. This ``__init__`` imports nothing.
"""
