"""Puts the test helpers (models.py) on the import path and registers the adapter."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import kernel_switchboard_transformers  # noqa: E402, F401  (registers "ksb")
