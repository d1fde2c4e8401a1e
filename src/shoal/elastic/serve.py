"""The job's rendezvous store and membership authority, as one launcher hosts
them, and their clean end: no thread, socket or port left behind.

The store listens on a socket bound here to the one address asked for
(c10d's own server listens on every interface, whatever host it is given)
and to port 0 unless a port is asked for, so no other process can take the
port between choosing and binding it.
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from shoal.elastic.authority import AuthorityConfig, MembershipAuthority
from shoal.errors import ControlError
from shoal.elastic.netaddr import WILDCARD
from shoal.train.rendezvous import Rendezvous, connect

log = logging.getLogger(__name__)

_STORE_TIMEOUT_S = 60.0


def host_store(bind: str, port: int) -> dist.TCPStore:
    """A master TCPStore listening on exactly (bind, port); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(1024)
    except OSError as error:
        listener.close()
        raise ControlError(f"cannot serve the rendezvous on {bind}:{port} ({error.strerror}); "
                           "pick another --bind address or port") from None
    bound_port = listener.getsockname()[1]
    try:
        return dist.TCPStore(_client_host(bind), bound_port, is_master=True, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S), use_libuv=True,
                             master_listen_fd=listener.detach())  # the store owns the socket now
    except (RuntimeError, dist.DistStoreError) as error:
        raise ControlError(f"cannot start the rendezvous store on {bind}:{bound_port}: {error}") from None


def _client_host(bind: str) -> str:
    return "127.0.0.1" if bind in WILDCARD else bind


class RendezvousServer:
    """Hosts the store; `start_authority` runs the authority beside it; `close` ends both."""

    def __init__(self, bind: str, port: int = 0) -> None:
        self.bind = bind
        self.store: dist.TCPStore | None = host_store(bind, port)
        self.port: int = self.store.port
        self.rdzv = Rendezvous(self.store)
        self.authority: MembershipAuthority | None = None
        self._watch_rdzv: Rendezvous | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.bind}:{self.port}"

    def start_authority(self, config: AuthorityConfig, process_alive: Callable[[str], bool | None],
                        event_log: Path) -> MembershipAuthority:
        # Its request watcher blocks in a store wait, so it gets its own connection.
        self._watch_rdzv = Rendezvous(connect(_client_host(self.bind), self.port))
        self.authority = MembershipAuthority(self.rdzv, config, process_alive=process_alive,
                                             event_log=event_log)
        self.authority.start(watch_requests=self._watch_rdzv)
        return self.authority

    def stop_authority(self) -> None:
        """Stop deciding membership (workers exiting at the end are not faults)."""
        if self.authority is not None:
            self.authority.stop()

    def close(self) -> None:
        """Stop the authority (it wakes and joins its threads) and shut the store down."""
        self.stop_authority()
        # Dropping the last references shuts the server down and closes its socket.
        self.authority = None
        self._watch_rdzv = None
        self.rdzv = None  # type: ignore[assignment]
        self.store = None
