"""The driver layer: the asyncio `Engine` that owns one `Core`, feeds it events on the real
clock and carries out the commands it returns through an `Executor` (the seam): `LocalExecutor`
(every node's `NodeHost` in this process) or `RayExecutor` (one `NodeAgent` actor per Ray node);
`NodeHost` runs one node's commands with its managers. Also the service YAML (`config`), engine
assembly (`build`), image operations over the nodes (`images`) and counters (`stats`).

Runs in: the process that serves or replays (`tangram serve`, the client SDK's embedded mode,
`tangram replay|demo|calibrate`), on its event loop; with Ray, `ray_agent.py` and the
`NodeHost` it hosts run in each node's actor process, the rest in the driver. May import:
`core`, `managers` (`NodeHost` builds them and holds them as the `managers.base` Protocols)
and `specfile`; never `sim` (its sibling: both drive the same core; an independence contract),
`api`, `client`, `replay` or `cli`.
"""
