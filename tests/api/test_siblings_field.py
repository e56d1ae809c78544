"""The native action's ``siblings`` (issue 39, item 5): the client's name for a GRPO group's
answers reaches the spec the core estimates from; an empty name is refused."""

from __future__ import annotations

import pydantic
import pytest

from arl_tangram.api.schemas import ActionIn
from arl_tangram.api.translate import native_actions


def test_siblings_reach_the_spec() -> None:
    (spec,) = native_actions(ActionIn(id="a", kind="test", siblings="prompt-7"))
    assert spec.siblings == "prompt-7"
    (plain,) = native_actions(ActionIn(id="b", kind="test"))
    assert plain.siblings is None


def test_an_empty_siblings_name_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="siblings"):
        ActionIn(id="a", siblings="")


def test_siblings_names_of_1_to_200_characters() -> None:
    assert ActionIn(siblings="p").siblings == "p"
    assert ActionIn(siblings="x" * 200).siblings == "x" * 200
    with pytest.raises(pydantic.ValidationError, match="siblings"):
        ActionIn(siblings="x" * 201)
