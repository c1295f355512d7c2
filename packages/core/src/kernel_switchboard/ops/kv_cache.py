"""kv_cache ops (being written)."""
