"""Per-test coverage contexts (issue 43): under `coverage run` (`make test TEST_COVERAGE=FILE`,
as `.ci/run` does), the lines each test runs are recorded under its node id, so that
`scripts/mutation_diff.py --coverage FILE` knows which tests reach a changed line without a
coverage run of its own. Without coverage it does nothing.

The context is switched when a test's setup starts, so its fixtures' lines count as its own;
what runs at collection (module bodies, imports) keeps the empty context. Registered by
tests/conftest.py (its hook is imported there).
"""

from __future__ import annotations

import pytest

try:
    import coverage
except ImportError:  # (coverage is a dev dependency; without it there is nothing to switch)
    coverage = None  # type: ignore[assignment]


def pytest_runtest_setup(item: pytest.Item) -> None:
    cov = coverage.Coverage.current() if coverage is not None else None
    if cov is not None:
        cov.switch_context(item.nodeid)
