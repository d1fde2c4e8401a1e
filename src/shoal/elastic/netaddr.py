"""Addresses of a multi-host run: the rendezvous endpoint, the local address
that reaches it, and the network interface gloo must bind to.

Gloo picks its interface from the hostname unless told (GLOO_SOCKET_IFNAME);
on a host with several interfaces, or in a network namespace, that guess
advertises an address its peers cannot reach, so the launcher tells it.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

from shoal.errors import ControlError

_SIOCGIFADDR = 0x8915  # ioctl: an interface's IPv4 address
WILDCARD = ("0.0.0.0", "::", "")


def parse_endpoint(text: str) -> tuple[str, int]:
    """`HOST:PORT` (a hostname, an IPv4 address, or [IPv6]:PORT)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not host or not 0 < number < 65536:
        raise ControlError(f"--rendezvous {text!r} is not HOST:PORT (e.g. 10.0.0.1:29400)")
    return host, number


def address_towards(host: str, port: int) -> str:
    """The local address this machine would use to reach `host` (no packet is sent)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as probe:
            probe.connect(family[4])  # UDP connect only picks a route
            return probe.getsockname()[0]
    except OSError as error:
        raise ControlError(f"no route to the rendezvous host {host} ({error}); check --rendezvous "
                           "and this host's network, or pass --bind ADDR") from None


def interface_of(address: str) -> str | None:
    """The name of the interface that holds IPv4 `address`, or None if none does."""
    try:
        wanted = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
            if ipaddress.IPv4Address(answer[20:24]) == wanted:
                return name
    return None


def worker_address(bind: str, rendezvous: tuple[str, int]) -> str:
    """The concrete address this host's workers advertise to their peers."""
    return address_towards(*rendezvous) if bind in WILDCARD else bind
