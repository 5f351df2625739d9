"""Stand-in of ``lmcache.v1``."""
