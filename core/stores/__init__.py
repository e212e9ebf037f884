"""The state drivers (memory, sqlite, redis, postgresql), each with its pilot registry."""
