"""The challenges each agent must answer, kept in memory: an agent's heartbeat reply
carries them without a store read. The store holds them too (the challenges' and the
plants' tables); each service that asks agents for files puts its open ones back here
when the coordinator starts."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable

from shoal.spec.audit import ChallengeView


class OpenChallenges:
    """agent -> challenge number -> what it is asked, safe across API threads."""

    def __init__(self) -> None:
        self._by_agent: dict[str, dict[int, ChallengeView]] = defaultdict(dict)
        self._lock = threading.Lock()

    def of(self, agent_id: str) -> tuple[ChallengeView, ...]:
        """What `agent_id` must answer now."""
        with self._lock:
            return tuple(self._by_agent.get(agent_id, {}).values())

    def ask(self, views: Iterable[ChallengeView]) -> None:
        """Each view's agent is asked for it (again, if it was already)."""
        with self._lock:
            for view in views:
                self._by_agent[view.agent_id][view.challenge] = view

    def drop(self, agent_id: str, challenge: int) -> None:
        """`agent_id` is no longer asked for `challenge`."""
        with self._lock:
            self._by_agent[agent_id].pop(challenge, None)

    def answered(self, challenge: int) -> None:
        """Nobody is asked for `challenge` any more (a step's parameters may have been
        asked of two keepers)."""
        with self._lock:
            for asked in self._by_agent.values():
                asked.pop(challenge, None)
