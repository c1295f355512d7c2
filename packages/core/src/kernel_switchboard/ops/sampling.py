"""sampling ops (being written)."""
