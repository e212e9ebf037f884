"""The state drivers (memory, sqlite, redis), each with its pilot registry."""
