"""The notify_email plugin package."""
