"""core/images.py's values (issue 43 item 2: the survivors of `make mutation` on it): the name
rule at its edges (one character, 128 and 129, every allowed punctuation mark, a leading mark, a
trailing newline, non-strings), `check_name`'s answer and its error word for word, and the warm
key."""

from __future__ import annotations

import pytest

from arl_tangram.core.errors import ImageError
from arl_tangram.core.images import NAME_RULE, check_name, valid_name, warm_key


@pytest.mark.parametrize(
    "name", ["a", "0", "Z", "A.b_c:d@e+f-g9", "a" * 128, "x" + "-" * 127, "py3.11", "org"]
)
def test_valid_names(name: str) -> None:
    assert valid_name(name) is True
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "a" * 129, "-a", ".a", "_a", "x\n", "a b", "a/b", "ä", "\na"])
def test_invalid_names(name: str) -> None:
    assert valid_name(name) is False
    with pytest.raises(ImageError) as got:
        check_name(name)
    assert str(got.value) == f"image name {name!r} is not valid ({NAME_RULE})"


@pytest.mark.parametrize("name", [None, 5, b"abc", ["abc"]])
def test_non_strings_are_not_names(name: object) -> None:
    assert valid_name(name) is False
    with pytest.raises(ImageError) as got:
        check_name(name)  # type: ignore[arg-type]
    assert str(got.value) == f"image name {name!r} is not valid ({NAME_RULE})"


def test_the_rule_and_the_warm_key() -> None:
    assert NAME_RULE == "letters, digits and ._:@+-, starting with a letter or digit, at most 128"
    assert warm_key("py311") == "image:py311"
    assert warm_key("") == "image:"
