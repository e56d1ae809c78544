"""Real runs of a trace and the simulator held to them: the closed-loop replay of a trace on
real sandboxes and models (`driver`, over an embedded engine or a running service: `backends`;
every policy in turn: `compare`), the work program that burns an action's ``work_s`` over its
allotment's cores (`work`), trace checks against the cluster (`inputs`), ``tangram calibrate``'s
measurements of this machine (`calibrate`), and the simulator's prediction on the calibrated
spec with its errors (`predict`). See docs/fidelity.md.

Runs in: the ``tangram replay|demo|calibrate`` process (and `benchmarks/bench_real.py`), which
also hosts the embedded engine, its managers' host side and the GPU manager; the work program
(`work.program`'s text) runs inside sandboxes, as an action's code. May import: `client`,
`runtime`, `sim`, `managers`, `specfile` and `core`; never `api` or `cli`.
"""
