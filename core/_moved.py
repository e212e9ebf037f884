"""The old import paths of gridgate.core, forwarded with a DeprecationWarning until 2.0.

Two kinds: the paths of API 1.4 that moved into core's sub-packages in 1.5 (a whole module,
:data:`MOVED_MODULES`, or names that left a module still at the top level, :data:`MOVED_NAMES`),
and the public names that two public modules exported until they were given one home each
(:data:`SECOND_HOMES`). The tables are data (the new places are named by string), so importing
``gridgate.core`` imports no sub-package: this module only forwards. Private: out-of-tree code
uses the new paths, as the warnings say.
"""

from __future__ import annotations

import sys
import warnings

TYPE_CHECKING = False  # typing is not imported at run time (the gate's start-up)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: The package whose old paths these are.
PACKAGE = __name__.rpartition(".")[0]

# --- the paths of API 1.4 that moved in 1.5 ----------------------------------------------
# Out-of-tree code that reached into core's internals keeps importing them until 2.0, told by a
# DeprecationWarning where each now lives.

#: A module that moved (``gridgate.core.X``) -> the modules its names live in now, searched in
#: order; a single one stands for the old module itself.
MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "director": ("engine.director",),
    "iteration": ("engine.iteration", "engine.runtime", "engine.failure"),
    "compose": ("engine.compose",),
    "tracking": (
        "engine.tracking",
        "engine.cancelling",
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


# --- names with a second home ---------------------------------------------------------------
# Each public name has one home, the module that defines it; the public module that also
# exported it keeps giving it to out-of-tree code until 2.0, with a warning naming the home.

#: A public module (``gridgate.core.X``) -> the names it no longer exports -> their home.
SECOND_HOMES: dict[str, dict[str, str]] = {
    "config": {"SECRET_SCHEMA": "secrets", "SecretError": "secrets", "read_secret": "secrets"},
    "failing": {"Episode": "model"},
    # API 1.12: the scheduler's own figures left the hook values for a module of their own
    "model": {
        name: "scheduler"
        for name in (
            "RpcCount",
            "SchedulerChange",
            "SchedulerRPCs",
            "SchedulerRequest",
            "SchedulerRequests",
        )
    },
    "testing": {"FakeClock": "clock"},
}


def _warn(message: str, frames: int = 0) -> None:
    # stacklevel 4: past this function, _told or _rehomed, and the forwarder (a module
    # __getattr__ or a loader): the line that used the old path; ``frames`` more when the
    # forwarder was called by the module's own __getattr__
    warnings.warn(message, DeprecationWarning, stacklevel=4 + frames)


def _told(old: str, new: str, frames: int = 0) -> None:
    _warn(
        f"{old} moved to {new} in gridgate's API 1.5 (an internal path: it may change again); "
        "the old path stops working at 2.0",
        frames,
    )


def _rehomed(old: str, name: str, home: str, frames: int) -> None:
    _warn(
        f"{old}: import {name} from {home}, its one home; the old path stops working at 2.0",
        frames,
    )


def moved_names(module: str) -> Callable[..., Any]:
    """A module ``__getattr__`` for the top-level ``module`` (``gridgate.core.state``) that
    gives each name it lost (:data:`MOVED_NAMES`, :data:`SECOND_HOMES`) from its new module,
    with a warning. A module with a ``__getattr__`` of its own calls it with ``frames=1``, so
    that the warning still names the line that used the old path."""
    short = module.rsplit(".", 1)[-1]

    def forward(name: str, frames: int = 0) -> Any:
        moved = MOVED_NAMES.get(short, {}).get(name)
        target = moved or SECOND_HOMES.get(short, {}).get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        import importlib

        new = f"{PACKAGE}.{target}"
        if moved:
            _told(f"{module}.{name}", f"{new}.{name}", frames)
        else:
            _rehomed(f"{module}.{name}", name, new, frames)
        return getattr(importlib.import_module(new), name)

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
        news = [f"{PACKAGE}.{target}" for target in self.targets]
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
        if package != PACKAGE or short not in MOVED_MODULES:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _MovedModule(MOVED_MODULES[short]))  # type: ignore[arg-type]


# importing gridgate.core imports this module: from then on the old module paths import
if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
