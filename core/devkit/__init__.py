"""For plugin authors and the docs, never on a run-time path: the reference generators, the
scaffold, the backend contract, and the kit of the private test services."""
