"""moe ops (being written)."""
