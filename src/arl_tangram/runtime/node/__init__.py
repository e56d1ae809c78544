"""NodeHost: one node's resource managers, and the execution of the core's commands on it.

Invariant: for every command it accepts, a NodeHost emits exactly the events the executor
contract promises (one ActionStarted then one ActionFinished per StartAction, one BatchFinished
per RunBatch, one ModelLoaded per LoadModel, one ModelUnloaded per UnloadModel); a failure of a
manager becomes a failed outcome event, never an exception out of `submit`. One event comes
unasked: a ModelUnloaded with a ``reason`` when an instance's worker died (the GPU manager's
``on_worker_death``), emitted before the BatchFinished of the batch it died in. Event times are this
host's ``time.monotonic()``; the engine re-stamps them on its own clock when they arrive.

A NodeHost holds no global state and assumes only that it runs inside one asyncio loop, so the
Ray executor can host one inside a NodeAgent actor unchanged (its ``emit`` then buffers events
for the driver to collect).

Rooms: `host` (`NodeHost`, the facade: start, close, ``info``), `dispatch` (the table from
command type to the path that runs it), `actions` (StartAction, ResizeAction, CancelAction),
`models` (RunBatch, LoadModel, UnloadModel), `sessions` (OpenSession, CloseSession), `reports`
(warm and memory reports), `seat` (the name, event sink and managers the paths share). The
node's environment images are `runtime.images.NodeImages` (``NodeHost.images``): every image
held is reported as warm state, and one the cache lacks is fetched on first use, before the
session or action that needs it (pulled from a peer, else imported from its source path); that
session's first action (or that one-shot action) reports what it waited as ``image_import_s``
and ``image_pull`` in its result. A pull in flight and the last ones are in
``info()["image_transfers"]`` (so in /v1/cluster); what this node sent its peers is
``info()["image_served"]``. Resizes are counted in ``info()["resizes"]`` (`actions`).
"""

from __future__ import annotations

from .host import NodeHost, machine_capacity

__all__ = ["NodeHost", "machine_capacity"]
