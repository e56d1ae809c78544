"""Resource managers: what runs actions on one node (the CPU manager `cpu/`, the GPU manager
`gpu/`) and the seam the runtime types them with (`base`).

Runs in: the service process (or a Ray NodeAgent); the CPU manager's fork server and sandboxes
are processes of their own (see `cpu/__init__`). May import: `core` and the standard library;
never `runtime`, `sim`, `api` or above (`make lint` checks it).
"""
