"""Stand-in of sglang.srt.observability (see sglang/__init__.py)."""
