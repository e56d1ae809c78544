"""Exceptions of ARL-Tangram.

    TangramError                  root: catch this to catch everything we raise
    ├── SpecError                 a cluster, trace or config file is malformed (file, line, field)
    ├── InvalidAction             a submitted action is malformed (names the field)
    │   └── RequestError*         a provider request is (managers/api/manager.py)
    ├── IllegalTransition         the core was asked to move an action along an edge that does
    │                             not exist; carries the action's story
    ├── ClosedError               you closed it (engine, client, session) and then used it
    ├── BrokenError               it broke under you (a sandbox, a model, a node died)
    │   └── IsolationUnavailable  the sandbox cannot get an isolation feature it must have
    ├── ImageError                an image cannot be imported, found or removed (says why)
    │   ├── ImageInUse            ... because sessions or actions use it
    │   └── ImageTooLarge         ... because it expands past a bound (answered 413)
    ├── LayerError*               a session's writable layer cannot be made (managers/cpu/images/layers.py)
    ├── ImagesUnsupported         the executor's nodes keep no image cache reachable from here
    ├── Overloaded*               the engine's queue is full: retry later (runtime/engine.py)
    ├── UnknownAction*            no action has this id (runtime/engine.py; also a KeyError)
    ├── Shed*                     an overloaded /run_code, answered 504 (api/service.py)
    ├── ProviderConfigError*      a providers entry of the service config is wrong (names the
    │                             field; managers/api/config.py)
    ├── RetrievalIndexError*      a corpus or a retriever's index cannot be used (names the line
    │                             or field; managers/retrieval/index.py)
    └── BodyTooLarge*             a request body over the limit, answered 413 (api/middleware.py)

    * defined where it is raised, in the layer that raises it; the rest here.

The HTTP status of each (api/app.py `_ERRORS`) is looked up along the class's MRO; a class
without an entry of its own or of a base in that table is a 500 (only ImageError, ImageInUse,
ImageTooLarge and ImagesUnsupported have statuses of their own, given by the image routes:
api/images.py).
"""

from __future__ import annotations


class TangramError(Exception):
    """Root of every exception ARL-Tangram raises on purpose."""


class SpecError(TangramError, ValueError):
    """A spec file (cluster YAML, trace JSONL, service config) is malformed."""

    def __init__(self, file: str, line: int | None, field: str, message: str) -> None:
        self.file, self.line, self.field, self.message = file, line, field, message
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {field}: {message}")


class InvalidAction(TangramError, ValueError):
    """A submitted action is malformed; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class IllegalTransition(TangramError, RuntimeError):
    """An action was asked to move along an edge that does not exist."""

    def __init__(self, action_id: str, src: object, dst: object, story: list[str]) -> None:
        self.action_id, self.story = action_id, story
        lines = "\n  ".join(story[-20:])
        super().__init__(f"action {action_id}: illegal transition {src} -> {dst}; story:\n  {lines}")


class ClosedError(TangramError, RuntimeError):
    """The object was closed by its owner and then used."""


class BrokenError(TangramError, RuntimeError):
    """The resource broke (sandbox, model instance, node) while in use."""


class IsolationUnavailable(BrokenError):
    """A required sandbox isolation feature is not available on this machine."""


class ImageError(TangramError):
    """An image cannot be imported, found or removed; the message says why."""


class ImageInUse(ImageError):
    """An image cannot be removed while sessions or actions use it."""


class ImageTooLarge(ImageError):
    """An image import passed a bound on what it may expand to (bytes, entries, the
    decompression ratio, the tenant's or the cache's total); nothing of it is kept."""


class ImagesUnsupported(TangramError):
    """This executor's nodes keep no image cache reachable from here."""
