"""Helpers shared by the whole test suite (``pythonpath = ["tests"]`` in pyproject.toml makes
this package importable as ``support`` from every test folder, with no ``sys.path`` edits).

- :mod:`support.uids`: ``AS_NOBODY``, the argv prefix that runs a command as the real
  ordinary uid ``nobody``.
- :mod:`support.ports`: ``free_port()``, a loopback port nothing listens on.
- :mod:`support.polling`: ``until()``, for states a real process reaches by itself.
- :mod:`support.proctable`: which processes a test left running (from /proc).
- :mod:`support.redis_server`: a real throw-away redis-server.
- :mod:`support.postgres_server`: a real throw-away PostgreSQL cluster.
- :mod:`support.servers`: real SMTP (aiosmtpd) and HTTP sinks for the notifier tests.
- :mod:`support.notifiers`: the notifier tests' fixtures over those servers.
- :mod:`support.lsfproxyd`: the token daemon as a real process, and its fixtures.
- :mod:`support.director`: scripted in-test backends and a config for director tests.
- :mod:`support.checkout`: the suite-start check that ``nobody`` can run this checkout.

What a plugin author would need too belongs in the public kit, ``gridgate.core.testing``
(the notifier ``Collector``, ``make_config``, stand-in commands), not here.
"""
