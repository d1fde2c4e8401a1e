"""The coordinator: the market's service, its store and its HTTP API.

`Coordinator` keeps the market and the store in step; `create_app` puts an
HTTP API with signed requests over it; `RoundLoop` runs the market rounds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.coordinator.api.app import create_app
    from shoal.coordinator.service import Coordinator
    from shoal.coordinator.settings import CoordinatorSettings

__all__ = ["Coordinator", "CoordinatorSettings", "create_app"]

# Loaded on first use: the service pulls in FastAPI, SQLAlchemy and the chain client
# (seconds of imports), and what lives beside it here (the report page of
# `shoal report`, the dashboard's charts) needs none of them.
_LAZY = {"create_app": "api.app", "Coordinator": "service", "CoordinatorSettings": "settings"}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'shoal.coordinator' has no attribute {name!r}")
    return getattr(importlib.import_module(f"shoal.coordinator.{_LAZY[name]}"), name)
