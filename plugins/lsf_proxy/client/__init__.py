"""Clients of the token daemon: ``client`` (the full client) and ``gateclient`` (the gate's
standard-library-only client). Imports nothing: the gate's shims import ``gateclient`` through
this package."""
