"""The lsf_proxy plugin package."""
