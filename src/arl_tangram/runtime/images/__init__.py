"""Environment images at the runtime layer (issue 17): the session-open command that names an
image, a node's image cache and its transfers between nodes, and the errors a remote node
answers with.

Invariant: the core does not know images; it knows warm state. The engine asks for a session
in an image with ``SessionRequested(warm_key=core.images.warm_key(NAME),
attachment=SessionImage(...))``, so the core prefers a node whose `NodeHost` reported that
image held (``WarmPoolReport``) and carries the attachment, opaque to it, on the session's
`OpenSession` to the node, whose CPU manager mounts the image. Image import /
list / remove are operations of the `Executor` seam (`runtime.executor`):
- a local executor imports at once on every node (or the one named), so the core's choice of
  node finds the image there (`LocalExecutor`);
- on Ray, an import reads the path on one node (the one named, else the driver's node, else
  the first that can read it); every other node learns which nodes hold the image (its
  *peers*) and, on first use, pulls the layers it lacks from one of them, content-addressed by
  layer (`transfer.Puller`, over an `ImagePeer`), and reports it held from then on
  (`RayExecutor`). No shared file system is needed.

Rooms: `session` (the attachment the core carries), `cache` (`NodeImages`: one node's cache,
its sources, the fetch on first use), `transfer` (`Puller` and `LayerServer`: the pulling and
the sending side of a layer in chunks; `HostPeer`, a node of this process as a peer), `peers`
(`ImagePeer`), `remote` (the typed answers and errors of a node's image calls on Ray). None
imports `runtime.node`.
"""

from __future__ import annotations

from .cache import NodeImages
from .peers import ImagePeer
from .remote import ErrorKind, Fetched, PeersSet, RemoteError, in_use, unwrap
from .session import SessionImage, session_image
from .transfer import HostPeer, LayerServer, Puller

__all__ = [
    "ErrorKind",
    "Fetched",
    "HostPeer",
    "ImagePeer",
    "LayerServer",
    "NodeImages",
    "PeersSet",
    "Puller",
    "RemoteError",
    "SessionImage",
    "in_use",
    "session_image",
    "unwrap",
]
