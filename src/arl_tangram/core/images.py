"""Environment images as the core, the simulator and the runtime see them: a name and a warm key.

Invariant: pure (no I/O). The core does not know images, it knows warm state: a node that holds
image NAME reports the warm key ``"image:NAME"`` (`warm_key`), and a session in that image asks
for nodes warm for the same key. The name rule is checked at every edge that takes a name (the
trace format, the service YAML, ``POST /v1/images``, the node's image store) with this one rule.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from .errors import ImageError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}\Z")  # (\Z: `$` would let "x\n" by)
NAME_RULE = "letters, digits and ._:@+-, starting with a letter or digit, at most 128"


def valid_name(name: object) -> TypeGuard[str]:
    """Whether ``name`` is a valid image name (`NAME_RULE`)."""
    return isinstance(name, str) and NAME_RE.match(name) is not None


def check_name(name: str) -> str:
    """``name`` if it is a valid image name, else ImageError saying why."""
    if not valid_name(name):
        raise ImageError(f"image name {name!r} is not valid ({NAME_RULE})")
    return name


def warm_key(image: str) -> str:
    """The core's warm-state key of a node holding ``image`` (``"image:NAME"``)."""
    return f"image:{image}"
