"""Reading spec files: YAML with the line of every mapping, for errors that name file:line: field.

This is the file-reading edge of `core.cluster.parse_cluster` (the core does no I/O) and of the
service config (`runtime.config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import yaml

from .core.cluster import ClusterSpec, parse_cluster
from .core.errors import SpecError


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of every mapping (as key ``__line__``)."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = cast(dict[str, Any], loader.construct_mapping(node, deep=True))
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; every mapping carries its line as ``__line__``.

    Errors are `SpecError` naming the file (and the line, for syntax errors).
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(str(p), None, "<file>", f"cannot read: {exc.strerror}") from None
    try:
        return yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass: safe
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SpecError(str(p), mark.line + 1 if mark else None, "<yaml>", str(exc)) from None


def load_cluster_yaml(path: str | Path) -> ClusterSpec:
    """Read a cluster spec file; errors are `SpecError` naming file:line: field."""
    return parse_cluster(read_yaml(path), str(path))
