"""Test stand-in of LMCache: only the remote-storage plugin interface fluxkv's connector meets
(see ../README.md). Not LMCache."""
