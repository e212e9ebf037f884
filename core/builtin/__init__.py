"""The built-in default plugins: each an entry point, held to the plugin rule (public names only)."""
