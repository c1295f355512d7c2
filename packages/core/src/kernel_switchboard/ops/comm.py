"""comm ops (being written)."""
