#!/usr/bin/env python3
"""Fail on any skipped test that the committed list does not allow (issue 27).

usage: check_skips.py SKIP_LOG [ALLOWED]   (ALLOWED defaults to tests/allowed_skips.txt)

SKIP_LOG is what tests/_skip_policy.py writes when TANGRAM_SKIP_LOG is set. A line of ALLOWED is
``NODEID_GLOB | REASON_SUBSTRING | why it is allowed``: a skip passes only when its node id
matches the glob (fnmatch) and its reason contains the substring. A missing or unreadable log
fails too (the hook did not run, so nothing is known about skips).
"""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path


def load_allowed(path: Path) -> list[tuple[str, str, str]]:
    rules = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(" | ")]
        if len(parts) != 3 or not all(parts):
            raise SystemExit(f"{path}:{n}: expected 'NODEID_GLOB | REASON | WHY', got {line!r}")
        rules.append((parts[0], parts[1], parts[2]))
    return rules


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    log = Path(argv[1])
    allowed = Path(argv[2]) if len(argv) == 3 else Path("tests/allowed_skips.txt")
    try:
        data = json.loads(log.read_text())
    except (OSError, ValueError) as e:
        print(f"check_skips: no skip log from pytest ({log}: {e}); "
              "was tests/_skip_policy.py loaded?", file=sys.stderr)
        return 1
    rules = load_allowed(allowed)
    bad = [(nid, why) for nid, why in data["skipped"]
           if not any(fnmatch.fnmatchcase(nid, g) and r in why for g, r, _ in rules)]
    ok = len(data["skipped"]) - len(bad)
    for nid, why in bad:
        print(f"UNEXPECTED SKIP: {nid}: {why}", file=sys.stderr)
    print(f"check_skips: {len(data['skipped'])} skipped ({ok} allowed by {allowed}, "
          f"{len(bad)} not)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
