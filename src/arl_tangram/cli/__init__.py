"""The ``tangram`` command: one module per sub-command (`serve`, `demo`, `simulate`, `replay`,
`calibrate`, `image`), each with ``add_parser`` and ``run``, dispatched by `main`; `_common`
holds what they share (console, exit 2 on bad input, cluster and calibration resolution,
policy and workload checks, progress bars, figure helpers). Flags and output are a public
contract (docs/architecture.md, DESIGN's last section).

Runs in: the ``tangram`` process, in the foreground; a sub-command's module is imported only
when it runs (or for ``--help``), so `tangram simulate` never loads the service's stack. May
import: every room below it (`replay`, `client`, `api`, `runtime`, `sim`, `managers`, `specfile`,
`core`), as late as it can; no room of the package imports `cli`.
"""
