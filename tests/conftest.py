"""Test configuration: hypothesis runs derandomized under CI (the same examples every run), so a
submission's result does not depend on the luck of the draw; locally it explores new examples."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

pytest_plugins = ["api_support"]  # fixtures of the API and database tests
