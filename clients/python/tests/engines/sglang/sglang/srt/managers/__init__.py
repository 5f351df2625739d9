"""Stand-in of sglang.srt.managers (see sglang/__init__.py)."""
