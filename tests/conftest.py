"""Shared pytest setup. Keep area-specific fixtures in that area's test files."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
