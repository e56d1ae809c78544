"""Resource managers: what runs actions on one node. The CPU manager (`cpu/`) runs code in
isolated sandboxes (warm pools, sessions, environment images); the GPU manager (`gpu/`) loads,
swaps and batches reward models; `base` holds the Protocols the runtime types them with
(`CodeRunner`, `ModelHost`).

Runs in: the process that hosts a node's `runtime.node.NodeHost` (the service, an embedded
engine, or a Ray NodeAgent). The CPU manager alone spans several processes, a sub-package for
each: the manager side in that host process (`cpu/host`), the fork server (`cpu/zygote`), each
sandbox's init and children (`cpu/sandbox`), and the image store on the node's disk
(`cpu/images`); each sub-package's ``__init__`` says which process runs it and what it may
import. May import: `core` and `specfile` (below it), the standard library and the managers'
own third-party stacks (torch and transformers for `gpu/`); never `runtime`, `sim`, `api` or
above (`make lint` checks it).
"""
