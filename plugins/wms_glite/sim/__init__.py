"""Stand-in gLite WMS commands for tests and the demo."""
