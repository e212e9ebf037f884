"""The built-in ``all`` admission: admits everything, the default when none is configured."""

from __future__ import annotations

from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.builtin.nokeys import NO_KEYS_SCHEMA, NoKeys
from gridgate.core.model import (
    AdmissionRequest,
    Grant,
)
from gridgate.core.plugins import Plugin


class AdmitAll(Plugin):
    """Admission control that admits everything: the default when none is configured."""

    config_schema: ClassVar[dict[str, Any]] = {**NO_KEYS_SCHEMA}
    settings_class = NoKeys

    @hookimpl(trylast=True)
    def gridgate_admit(self, request: AdmissionRequest) -> Grant:
        return Grant(issuer="all", category=request.category)

    @hookimpl(trylast=True)
    def gridgate_release(self, grant: Grant) -> None:
        """Nothing was taken, so nothing is given back."""
