"""Suite-wide settings."""

from __future__ import annotations

import os

from hypothesis import settings

# CI replays the same examples on every run, so a red build always means a changed behaviour,
# never a newly drawn example; local runs keep exploring (and record failures in .hypothesis/).
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
