"""A gate in front of a job's rendezvous store, and the tunnel that passes it.

The store (c10d's TCPStore) has no authentication, so behind a gate it
listens on loopback only. The gate takes TLS 1.3 connections on the public
address; the first line a client sends names an identity and its token
(`shoal.elastic.gate_keys`), and only then are its bytes relayed to the
store, both ways. A lease's requests are read one by one
(`shoal.elastic.store_wire`) and relayed only when the store policy allows them
(`shoal.elastic.store_policy`): the first one refused closes the connection,
before any byte of it reaches the store. The tunnel is the other end, on a client's
machine: a loopback listener that c10d's own client connects to, each of its
connections carried over TLS to the gate, with the gate's certificate pinned
(its SHA-256, which the client learned from the coordinator).

Both run an asyncio loop in a thread of their own: OpenSSL objects must not be
read and written from two threads at once, and a relay of small messages
needs no more than one loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

from shoal import jsonl
from shoal.errors import ControlError
from shoal.elastic.gate_keys import GateKeys
from shoal.elastic.store_policy import LeasePolicy, StoreView, lease_of
from shoal.elastic.store_wire import (MAX_VALUE_BYTES, STOP_WAITING, VALIDATION_MAGIC, Query,
                                     Request, RequestReader, WireError, encode, value_answer)
from shoal.spec.coordinator import RendezvousPass
from shoal.train.rendezvous import GATE_HOLDS_KEY, HELD_READ

log = logging.getLogger(__name__)

HELLO_LIMIT = 1024  # bytes of the first line: an identity and a token
HELLO_TIMEOUT_S = 10.0
REVOKED_EVERY_S = 1.0  # how often the gate re-reads its revoked tokens and cuts their connections
_ADMITTED = b"admitted\n"
_CHUNK = 1 << 16
MAX_HOLD_S = 1.0  # the longest a held read waits at the gate for its key
# And the shortest: a hold that runs out costs the store a new loopback connection, so a
# lease asking for holds of nothing cannot have the gate reconnect faster than this.
MIN_HOLD_S = 0.05


class GateRefused(ControlError):
    """The gate did not admit this client (wrong token, wrong certificate, no answer)."""


class _LoopThread:
    """An asyncio loop running in a daemon thread, with its servers closed on `close`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet_handshakes)
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._servers: list[asyncio.AbstractServer] = []

    def run(self, coroutine: Awaitable) -> object:
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result()

    def spawn(self, coroutine: Awaitable) -> None:
        """Run `coroutine` in the loop until it returns or the loop closes."""
        asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def serve(self, handler: Callable, host: str, port: int, **options: object) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await handler(reader, writer)
            except asyncio.CancelledError:  # closing: a connection's end, not an error (the
                writer.close()              # server's callback would log a cancelled task)

        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_server(handle, host, port, **options)

        server = self.run(start())
        self._servers.append(server)
        return server.sockets[0].getsockname()[1]

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:  # the relays of open connections
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            self.run(stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        self.loop.close()


class _Refused(Exception):
    """A lease's request the store policy does not allow."""


class StoreGate:
    """Admits token holders on (bind, port) to the store at `store` (a loopback endpoint).
    With `view` (what the job host reads of its store), each lease is held to the store
    policy; without, every admitted client writes any key (a gate whose identities are
    the operator's own hosts)."""

    def __init__(self, bind: str, port: int, store: tuple[str, int], keys: GateKeys,
                 view: StoreView | None = None) -> None:
        self.keys, self.store, self.view = keys, store, view
        self._policies: dict[int, LeasePolicy] = {}  # lease -> its rights, across connections
        self.refused: list[dict[str, object]] = []  # what was refused, newest last
        self._loop = _LoopThread("store-gate")
        try:
            self.port = self._loop.serve(self._admit, bind, port, ssl=keys.server_context(),
                                         ssl_handshake_timeout=HELLO_TIMEOUT_S,
                                         reuse_address=True)
        except OSError as error:
            self._loop.close()
            raise ControlError(f"cannot serve the rendezvous gate on {bind}:{port} "
                               f"({error.strerror}); pick another --bind address or port") from None
        self.admitted: dict[str, int] = {}  # identity -> connections admitted (for the log)
        self.relayed: dict[str, int] = {}  # lease identity -> requests relayed to the store
        # What they asked, by query and key family ("WAIT decision", "SET hb"): where a
        # step's round trips go (bench/gate.py prints it).
        self.relayed_kinds: dict[str, int] = {}
        self._open: dict[str, set[asyncio.StreamWriter]] = {}  # identity -> its connections
        self._revoked: frozenset[str] | None = None  # None: unreadable, every token refused
        self._revoked_stamp: object = ()
        self._read_revoked()
        self._loop.spawn(self._cut_revoked())

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            line = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
            hello = json.loads(line[:HELLO_LIMIT]) if line.endswith(b"\n") else None
            identity, token = hello["identity"], hello["token"]
            if not (isinstance(identity, str) and isinstance(token, str) and token.isascii()):
                raise TypeError("identity and token are strings (a token, of hex digits)")
        except (asyncio.TimeoutError, ValueError, KeyError, TypeError, ConnectionError,
                asyncio.LimitOverrunError):
            log.warning("rendezvous gate: %s sent no hello; closed", peer)
            writer.close()
            return
        if not self.keys.admits(identity, token):
            log.warning("rendezvous gate: %s showed a wrong token for %r; closed", peer, identity)
            writer.write(b"refused: the token is not this job host's for that identity\n")
            await _close(writer)
            return
        self._read_revoked()
        if self._revoked is None or identity in self._revoked:
            log.warning("rendezvous gate: %s showed the revoked token of %r; closed", peer, identity)
            writer.write(b"refused: this identity's token is revoked (its lease ended)\n")
            await _close(writer)
            return
        try:
            store_reader, store_writer = await asyncio.open_connection(*self.store)
        except OSError as error:
            log.error("rendezvous gate: the store at %s:%d is unreachable (%s)", *self.store, error)
            writer.close()
            return
        self.admitted[identity] = self.admitted.get(identity, 0) + 1
        writer.write(_ADMITTED)
        self._open.setdefault(identity, set()).add(writer)
        policy = self._policy(identity)
        try:
            if policy is None:
                await _relay(reader, writer, store_reader, store_writer)
            else:
                await self._police(identity, policy, reader, writer, store_reader, store_writer)
        finally:
            self._open[identity].discard(writer)

    def _policy(self, identity: str) -> LeasePolicy | None:
        lease = lease_of(identity)
        if self.view is None or lease is None:
            return None
        if lease not in self._policies:
            self._policies[lease] = LeasePolicy(lease, self.view)
        return self._policies[lease]

    async def _police(self, identity: str, policy: LeasePolicy,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      store_reader: asyncio.StreamReader,
                      store_writer: asyncio.StreamWriter) -> None:
        """Relay the store's answers unchanged and the lease's requests one whole request at
        a time, each as the policy allows; close both ends at the first it does not."""
        requests = RequestReader()
        held = _HeldReads(self.store)

        async def forward() -> None:
            try:
                while data := await reader.read(_CHUNK):
                    for request in requests.feed(data):
                        said = policy.refusal(request)
                        if said is not None:
                            raise _Refused(request, said)
                        self.relayed[identity] = self.relayed.get(identity, 0) + 1
                        kind = request_kind(request)
                        self.relayed_kinds[kind] = self.relayed_kinds.get(kind, 0) + 1
                        hold_s = held_for_s(request)
                        if hold_s is None:
                            store_writer.write(request.raw)
                            continue
                        # c10d's client waits for each answer before its next request, so
                        # no answer of the store is due to this client while it waits for
                        # this one (a client that does not wait garbles only its own).
                        await store_writer.drain()
                        key = request.keys[0]
                        value = b"1" if key == "/" + GATE_HOLDS_KEY else await held.read(key, hold_s)
                        writer.write(value_answer(request.values[0] if value is None else value))
                        await writer.drain()
                    await store_writer.drain()
            except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
                pass
            finally:
                store_writer.close()
                held.close()

        _no_delay(writer, store_writer)
        try:
            await asyncio.gather(forward(), _copy(store_reader, writer))
        except (_Refused, WireError) as error:
            self._refuse(identity, error)
        finally:
            for end in (writer, store_writer):
                end.close()

    def _refuse(self, identity: str, error: Exception) -> None:
        """Say what was refused, to the log and to `refusals.jsonl` beside the gate's keys
        (where the operator and the coordinator read which lease tried what)."""
        if isinstance(error, _Refused):
            request, reason = error.args
            entry = {"t": time.time(), "identity": identity, "query": request.query.name,
                     "keys": list(request.keys[:4]), "reason": reason}
        else:
            entry = {"t": time.time(), "identity": identity, "query": None, "keys": [],
                     "reason": str(error)}
        log.warning("rendezvous gate: refused %s's %s %s (%s); its connection is closed",
                    identity, entry["query"] or "bytes", entry["keys"], entry["reason"])
        self.refused.append(entry)
        try:
            jsonl.append(self.keys.folder / "refusals.jsonl", json.dumps(entry))
        except OSError as failure:
            log.error("rendezvous gate: cannot record a refusal: %s", failure)

    def _read_revoked(self) -> None:
        """The revoked tokens, read again once their file changed (unreadable: all are)."""
        path = self.keys.folder / "revoked.json"
        try:
            stat = path.stat()
            stamp: object = (stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        if stamp == self._revoked_stamp:
            return
        self._revoked_stamp = stamp
        try:
            self._revoked = self.keys.revoked()
        except ControlError as error:
            log.error("rendezvous gate: %s", error)
            self._revoked = None

    async def _cut_revoked(self) -> None:
        """Close the open connections of tokens revoked since they were admitted: a lease
        that ended keeps no hold on the job's store."""
        while True:
            await asyncio.sleep(REVOKED_EVERY_S)
            self._read_revoked()
            for identity, writers in self._open.items():
                if writers and (self._revoked is None or identity in self._revoked):
                    log.warning("rendezvous gate: %r revoked; its %d connection(s) closed",
                                identity, len(writers))
                    for writer in list(writers):
                        writer.close()

    def close(self) -> None:
        self._loop.close()


def held_for_s(request: Request) -> float | None:
    """How long to hold `request`, a read that waits for its key (Rendezvous.read_held),
    from MIN_HOLD_S to MAX_HOLD_S; None for any other request (relayed to the store as it
    is)."""
    if (request.query is not Query.COMPARE_SET or len(request.keys) != 1
            or request.values[0] != request.values[1]
            or not request.values[0].startswith(HELD_READ)):
        return None
    try:
        asked = int(request.values[0][len(HELD_READ):]) / 1000
    except ValueError:
        return None  # the store answers it as a read of a missing key
    return min(MAX_HOLD_S, max(MIN_HOLD_S, asked))


class _HeldReads:
    """One client connection's held reads: a wait for the key and a read of it on a store
    connection of their own (the job host's loopback), so that the client's round trip
    through tunnel and gate is one. A wait that runs out closes that connection (the store
    drops a closed connection's wait: no cancel to race with the key's arrival)."""

    def __init__(self, store: tuple[str, int]) -> None:
        self.store = store
        self._ends: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def read(self, key: str, hold_s: float) -> bytes | None:
        if self._ends is None:
            reader, writer = await asyncio.open_connection(*self.store)
            _no_delay(writer)
            writer.write(encode(Request(Query.VALIDATE, number=VALIDATION_MAGIC)))
            self._ends = reader, writer
        reader, writer = self._ends
        writer.write(encode(Request(Query.WAIT, (key,))))
        await writer.drain()
        try:
            said = await asyncio.wait_for(reader.readexactly(1), hold_s)
        except asyncio.TimeoutError:
            self.close()
            return None
        if said != STOP_WAITING:
            raise ConnectionError(f"the store answered a wait with {said!r}")
        writer.write(encode(Request(Query.GET, (key,))))
        await writer.drain()
        size = int.from_bytes(await reader.readexactly(8), "little")
        if size > MAX_VALUE_BYTES:
            raise ConnectionError(f"the store answered a read with {size} bytes")
        return await reader.readexactly(size)

    def close(self) -> None:
        if self._ends is not None:
            self._ends[1].close()
            self._ends = None


class StoreTunnel:
    """A loopback endpoint whose connections reach the store behind a job host's gate at
    (host, port), as `gate_pass` (the certificate pinned, the token shown)."""

    def __init__(self, host: str, port: int, gate_pass: RendezvousPass) -> None:
        self.remote, self.gate_pass = (host, port), gate_pass
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._context.minimum_version = ssl.TLSVersion.TLSv1_3
        # The certificate is self-signed and pinned by its hash below: no CA, no host name.
        self._context.check_hostname = False
        self._context.verify_mode = ssl.CERT_NONE
        self._loop = _LoopThread("store-tunnel")
        self.port = self._loop.serve(self._carry, "127.0.0.1", 0)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def check(self, timeout_s: float = HELLO_TIMEOUT_S) -> None:
        """Pass the gate once, so that a wrong token or certificate is said now, in words,
        and not as a store that times out later."""
        async def once() -> None:
            reader, writer = await asyncio.wait_for(self._through_gate(), timeout_s)
            writer.close()

        try:
            self._loop.run(once())
        except asyncio.TimeoutError:
            raise GateRefused(f"the rendezvous gate at {self._where} did not answer within "
                              f"{timeout_s:.0f} s") from None
        except OSError as error:
            raise GateRefused(f"cannot reach the rendezvous gate at {self._where} ({error})") from None

    @property
    def _where(self) -> str:
        return f"{self.remote[0]}:{self.remote[1]}"

    async def _through_gate(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(*self.remote, ssl=self._context,
                                                       ssl_handshake_timeout=HELLO_TIMEOUT_S)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        if hashlib.sha256(der).hexdigest() != self.gate_pass.cert_sha256:
            writer.close()
            raise GateRefused(f"the rendezvous gate at {self._where} shows another certificate "
                              "than the coordinator named: not this job's host (or someone in "
                              "between); nothing was sent to it")
        writer.write(json.dumps({"identity": self.gate_pass.identity,
                                 "token": self.gate_pass.token}).encode() + b"\n")
        answer = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
        if answer != _ADMITTED:
            writer.close()
            said = answer.decode(errors="replace").strip() or "the connection closed"
            raise GateRefused(f"the rendezvous gate at {self._where} did not admit "
                              f"{self.gate_pass.identity}: {said}")
        return reader, writer

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            gate_reader, gate_writer = await self._through_gate()
        except (GateRefused, OSError, asyncio.TimeoutError) as error:
            log.error("store tunnel: %s", error)
            writer.close()
            return
        await _relay(reader, writer, gate_reader, gate_writer)

    def close(self) -> None:
        self._loop.close()


def _quiet_handshakes(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """A client that is not TLS, or not ours, fails its handshake: that is the gate
    working, worth a line at debug level, not the loop's error with a traceback."""
    if isinstance(context.get("exception"), (ssl.SSLError, ConnectionError, TimeoutError)):
        log.debug("rendezvous gate: %s", context.get("message"))
        return
    loop.default_exception_handler(context)


async def _relay(a_reader: asyncio.StreamReader, a_writer: asyncio.StreamWriter,
                 b_reader: asyncio.StreamReader, b_writer: asyncio.StreamWriter) -> None:
    """Copy bytes both ways until either side closes, then close both."""
    _no_delay(a_writer, b_writer)
    try:
        await asyncio.gather(_copy(a_reader, b_writer), _copy(b_reader, a_writer))
    finally:
        for writer in (a_writer, b_writer):
            writer.close()


def _no_delay(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        sock = writer.get_extra_info("socket")
        if sock is not None:  # small request/answer messages: no Nagle delay
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()  # the other direction then ends too


async def _close(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.drain()
    except ConnectionError:
        pass
    writer.close()


def request_kind(request: Request) -> str:
    """A request's query and the family of its first key: `SET hb`, `WAIT decision`."""
    # c10d's client puts "/" before every key.
    family = request.keys[0].removeprefix("/").split("/", 1)[0] if request.keys else ""
    return f"{request.query.name} {family}".rstrip()
