"""The built-in ``all`` admission: admits everything, the default when none is configured."""

from __future__ import annotations

from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.model import (
    AdmissionRequest,
    Grant,
)
from gridgate.core.plugins import Plugin


class AdmitAll(Plugin):
    """Admission control that admits everything: the default when none is configured."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }

    @hookimpl(trylast=True)
    def gridgate_admit(self, request: AdmissionRequest) -> Grant:
        return Grant(issuer="all", category=request.category)

    @hookimpl(trylast=True)
    def gridgate_release(self, grant: Grant) -> None:
        """Nothing was taken, so nothing is given back."""
