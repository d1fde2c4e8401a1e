"""Request quotas, a service the coordinator holds: how many requests one signing key,
and one client address, may send in a window (settings.key_quota, address_quota).

Counted by `limits` with a sliding window counter in memory: two counters per key and
window, whatever the rate, so a million keys cost megabytes, not a list of timestamps
each. A key is charged only once its signature is checked (api/auth.py): nobody can
spend another key's quota by naming its address. An address is charged for every
request before a byte of it is read (api/quota_gate.py), signed or not, so a flood
of forged signatures costs its sender its address's quota, not the coordinator's time.
"""

from __future__ import annotations

import math
import time

from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import SlidingWindowCounterRateLimiter

from shoal.coordinator.errors import RateLimited


class RequestQuotas:
    """Per-key and per-address quotas; `charge_*` raises `RateLimited` past either."""

    def __init__(self, key_quota: str, address_quota: str,
                 storage: MemoryStorage | None = None) -> None:
        """`key_quota`, `address_quota`: limits' notation ("60/second;1800/minute"), ""
        for none. `storage`: where the windows are counted (a test's, to move its clock)."""
        self.storage = storage or MemoryStorage()
        self.limiter = SlidingWindowCounterRateLimiter(self.storage)
        self.per_key = _parsed(key_quota)
        self.per_address = _parsed(address_quota)

    def charge_key(self, address: str) -> None:
        """One request signed by `address` (checked): refused past the key quota."""
        self._charge(self.per_key, "key", address.lower(), f"signing key {address}",
                     "SHOAL_COORDINATOR_KEY_QUOTA")

    def charge_address(self, host: str) -> None:
        """One request from client address `host`: refused past the address quota."""
        self._charge(self.per_address, "address", host, f"client address {host}",
                     "SHOAL_COORDINATOR_ADDRESS_QUOTA")

    def _charge(self, items: list[RateLimitItem], kind: str, identity: str, who: str,
                setting: str) -> None:
        # Tested first, hit after: a refused request is not counted, so a flood does not
        # push its sender's window further out than its own rate does.
        for item in items:
            if not self.limiter.test(item, kind, identity):
                reset_s = self.limiter.get_window_stats(item, kind, identity).reset_time
                wait_s = max(1, math.ceil(reset_s - time.time()))
                raise RateLimited(f"{who} reached its quota of {item} requests (the "
                                  f"coordinator's {setting}); nothing was done: ask again in "
                                  f"{wait_s} s, and send less often", wait_s)
        for item in items:
            self.limiter.hit(item, kind, identity)


def _parsed(quota: str) -> list[RateLimitItem]:
    return parse_many(quota) if quota.strip() else []
