"""Stand-in of sglang.srt.mem_cache (see sglang/__init__.py)."""
