"""The Grid Engine backend, and a private Grid Engine cell for tests, benches and people."""
