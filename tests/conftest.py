"""Suite-wide settings, applied before any test module (or ray) is imported."""

import os

# Ray: no usage stats, and one-machine clusters on the loopback address only (Ray's
# single-machine mode), so no test traffic leaves 127.0.0.0/8.
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
