"""Load gridgate's test fixtures (gridgate_clock, gridgate_stand_in, gridgate_pm, ...)."""

pytest_plugins = ["gridgate.core.testing"]
