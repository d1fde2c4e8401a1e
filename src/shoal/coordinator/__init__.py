"""The coordinator: the market's service, its store and its HTTP API.

`Coordinator` keeps the market and the store in step; `create_app` puts an
HTTP API with signed requests over it; `RoundLoop` runs the market rounds.
"""

from shoal.coordinator.api.app import create_app
from shoal.coordinator.service import Coordinator
from shoal.coordinator.settings import CoordinatorSettings

__all__ = ["Coordinator", "CoordinatorSettings", "create_app"]
