"""gridgate's core: the plugin API at the top level, the engine and its parts in sub-packages.

A module directly in ``gridgate.core`` is public: its ``__all__`` is its part of docs/api.md. A
sub-package (``engine``, ``builtin``, ``stores``, ``commands``, ``devkit``) is internal and may
change in any release (CONTRIBUTING.md, "Where things go").
"""

from __future__ import annotations

import sys
import warnings

TYPE_CHECKING = False  # typing is not imported at run time: see __getattr__
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import pluggy

    #: Decorate a plugin method with this to implement a hook (``@hookimpl``,
    #: ``@hookimpl(trylast=True)``); typed as pluggy's marker, so the method keeps its type.
    hookimpl: pluggy.HookimplMarker
    hookspec: pluggy.HookspecMarker

__version__ = "0.1.0"

#: The plugin API's version, ``MAJOR.MINOR``: MINOR grows when hooks, fields or names are
#: added, MAJOR when one a plugin may use changes or goes away (docs/api.md says what is kept).
API_VERSION = "1.6"

PROJECT = "gridgate"

__all__ = ["API_VERSION", "hookimpl"]


def __getattr__(name: str) -> Any:
    """``hookimpl`` (decorate a plugin method with it to implement a hook) and ``hookspec``
    (used only by :mod:`gridgate.core.hookspecs`), made on first use: a program that imports
    a light module of gridgate (the gate's run-time path) does not pay for pluggy."""
    if name not in ("hookimpl", "hookspec"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import pluggy

    marker = pluggy.HookimplMarker if name == "hookimpl" else pluggy.HookspecMarker
    value = globals()[name] = marker(PROJECT)
    return value


# --- the paths of API 1.4 that moved in 1.5 ------------------------------------------------------
# Out-of-tree code that reached into core's internals keeps importing them until 2.0, told by a
# DeprecationWarning where each now lives. The tables are data (the new places are named by
# string), so the top level imports no sub-package: it only forwards.

#: A module that moved (``gridgate.core.X``) -> the modules its names live in now, searched in
#: order; a single one stands for the old module itself.
MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "director": ("engine.director",),
    "iteration": ("engine.iteration", "engine.runtime", "engine.failure"),
    "compose": ("engine.compose",),
    "tracking": (
        "engine.tracking",
        "engine.limits",
        "engine.pending",
        "engine.retired",
        "engine.aborted",
    ),
    "retry": ("engine.retry",),
    "stall": ("engine.stall",),
    "credential_episodes": ("engine.credential_episodes",),
    "contract": ("engine.contract",),
    "config_checks": ("engine.config_checks",),
    "resilient": ("engine.resilient",),
    "bans": ("builtin.bans",),
    "gocdb": ("builtin.gocdb",),
    "efficiency": ("builtin.efficiency",),
    "escalation": ("builtin.escalation",),
    "demand": ("builtin.demand",),
    "waiting": ("builtin.waiting",),
    "state_redis": ("stores.redis",),
    "pilots_redis": ("stores.redis",),
    "pilots": ("state", "stores.sqlite"),
    "launch": ("commands.launch",),
    "logs": ("commands.logs",),
    "outbox_cli": ("commands.outbox",),
    "pilots_cli": ("commands.pilots",),
    "report": ("commands.report",),
    "refdocs": ("devkit.refdocs",),
    "docgen": ("devkit.docgen",),
    "samples": ("devkit.samples",),
    "scaffold": ("devkit.scaffold",),
    "backend_contract": ("devkit.backend_contract",),
}

#: A name that left a module still at the top level -> the module it lives in now.
MOVED_NAMES: dict[str, dict[str, str]] = {
    "cli": {
        "cli": "commands.app",
        "main": "commands.app",
        "open_state_or_exit": "commands.servers",
    },
    "config": {
        "DIRECTOR_SCHEMA": "engine.section",
        "ConfigSource": "engine.reload",
        "ReloadOutcome": "engine.reload",
        "cut_problem": "engine.reload",
    },
    "credentials": {"X509Proxy": "builtin.x509_proxy"},
    "defaults": {
        "RandomSelector": "builtin.selectors",
        "RoundRobinSelector": "builtin.selectors",
        "ThroughputSelector": "builtin.selectors",
        "RULE_SCHEMA": "builtin.classifier",
        "RuleClassifier": "builtin.classifier",
        "compile_rules": "builtin.classifier",
        "match_rules": "builtin.classifier",
        "generic_failure": "builtin.classifier",
        "LogNotifier": "builtin.notifiers",
        "FileNotifier": "builtin.notifiers",
        "AdmitAll": "builtin.admission",
    },
    "metrics": {"DirectorMetrics": "engine.metrics", "DURATION_BUCKETS": "engine.metrics"},
    "plugins": {
        name: "engine.loader"
        for name in (
            "DEFAULT_PLUGINS",
            "InstalledPlugin",
            "build_plugin_manager",
            "cli_plugin_manager",
            "configured_plugins",
            "fill_defaults_for",
            "installed_plugins",
            "new_plugin_manager",
        )
    },
    "state": {"MemoryState": "stores.memory", "SqliteState": "stores.sqlite"},
    "weights": {
        name: "builtin.selectors"
        for name in (
            "DEFAULT_THROUGHPUT_FLOOR",
            "DEFAULT_THROUGHPUT_WINDOW",
            "THROUGHPUT_SCHEMA",
            "read_throughput",
            "throughput",
            "throughput_weights",
        )
    },
}


def _told(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new} in gridgate's API 1.5 (an internal path: it may change again); "
        "the old path stops working at 2.0",
        DeprecationWarning,
        stacklevel=3,
    )


def moved_names(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the top-level ``module`` (``gridgate.core.state``) that
    gives each name it lost (:data:`MOVED_NAMES`) from its new module, with a warning."""
    short = module.rsplit(".", 1)[-1]

    def forward(name: str) -> Any:
        target = MOVED_NAMES.get(short, {}).get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        import importlib

        _told(f"{module}.{name}", f"{__name__}.{target}.{name}")
        return getattr(importlib.import_module(f"{__name__}.{target}"), name)

    return forward


class _MovedModule:
    """Loader of a moved module: the old name gets the new module itself, or, for a module
    split in several, a module whose attributes come from each of them in turn."""

    def __init__(self, targets: tuple[str, ...]) -> None:
        self.targets = targets

    def create_module(self, spec: Any) -> None:
        return None  # the default module; exec_module replaces it

    def exec_module(self, module: Any) -> None:
        import importlib

        old = module.__name__
        news = [f"{__name__}.{target}" for target in self.targets]
        _told(old, " and ".join(news))
        if len(news) == 1:
            # the import system hands back what sys.modules holds after exec: the new module
            sys.modules[old] = importlib.import_module(news[0])
            return
        modules = [importlib.import_module(name) for name in news]

        def forward(name: str) -> Any:
            for target in modules:
                if hasattr(target, name):
                    return getattr(target, name)
            raise AttributeError(f"module {old!r} has no attribute {name!r}")

        module.__getattr__ = forward


class _MovedFinder:
    """Finds ``gridgate.core.X`` for each X of :data:`MOVED_MODULES` (a meta path finder)."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, short = fullname.rpartition(".")
        if package != __name__ or short not in MOVED_MODULES:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _MovedModule(MOVED_MODULES[short]))  # type: ignore[arg-type]


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
