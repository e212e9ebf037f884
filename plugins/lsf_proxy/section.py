"""The top-level ``proxyd:`` section of a site config, as a ``gridgate.sections`` entry point.

Apart from :mod:`gridgate.plugins.lsf_proxy.config` so that the gate's shims, which read that
module's defaults, do not load the plugin machinery."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from gridgate.core.plugins import ConfigProblems, Plugin
from gridgate.plugins.lsf_proxy.config import SECTION_SCHEMA
from gridgate.plugins.lsf_proxy.schedulers import config_problems
from gridgate.plugins.lsf_proxy.settings import ProxydSettings


class ProxydSection(Plugin):
    """The top-level ``proxyd:`` section of a site config (entry point ``gridgate.sections``).

    Only its schema and cross-key checks are used: the section configures the daemon and
    its clients, it implements no hook."""

    config_schema: ClassVar[dict[str, Any]] = SECTION_SCHEMA
    settings_class = ProxydSettings

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        """The settings' cross-key rules (:meth:`ProxydSettings.cross_rules`: the policy
        rules, host names, the TCP key, bypass keys without a scheduler, the adaptive
        entries), then the scheduler plugin named and its options."""
        return [*super().config_errors(section), *config_problems(section.get("bypass") or {})]
