"""Stand-in of sglang.srt (see sglang/__init__.py)."""
