"""The ``gridgate`` command line."""
