"""The notify_ggus plugin package."""
