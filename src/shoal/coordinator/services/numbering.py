"""How the coordinator numbers and names what it hands out, where both the services
and the proof services must read the same scheme (proofs may import services only)."""

from __future__ import annotations

# The numbers agents answer plants' fetches under: apart from verifiers' challenges, so
# the public challenge list has no gaps where plants were fetched.
FETCH_BASE = 2**48

