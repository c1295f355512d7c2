"""rope ops (being written)."""
