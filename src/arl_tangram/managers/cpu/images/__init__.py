"""Environment images on a node's disk: the content-addressed store and writable layers.

Runs in: the service process (the manager, `tangram image`, benchmarks), in worker threads;
never in the fork server or a sandbox.
Holds: the store (`store`: import, list, acquire/release, remove), the archive readers
(`archives`: OCI layout, docker-archive, root file system), the safe tar extractor (`extract`),
writable per-session layers (`layers`: one detached ext4 per session), a layer between two
nodes' stores (`transfer`) and small images built without a container tool (`imagekit`).
May import: the ground floor (`_linux`), `core` (errors), and the standard library; not `host`,
`zygote` or `sandbox`. The image *name* rule and the warm key are `core.images` (the simulator
uses them too). This ``__init__`` imports nothing.
"""
