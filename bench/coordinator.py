"""Heartbeat latency of the coordinator with 1,000 agents beating once a second
(issue 9): can one coordinator on one machine keep a fleet alive?

The coordinator runs as it would be deployed, in its own process (uvicorn on
loopback, market rounds on, a SQLite file or the PostgreSQL URL given), with
`--agents` providers each registered with one agent before the clock starts.
Then every agent beats once a second for `--duration-s`, each at its own
phase of the second, on its own keep-alive connection. The agents are
simulated, so each beat is signed in setup with its planned send time as the
signed time (the coordinator accepts 30 s of skew) and held as the bytes of
its HTTP request: the generator only writes bytes and reads replies, so it
is not the bottleneck on a small machine. Every beat is still checked in
full by the coordinator: signature, fresh nonce, the provider role.

Prints one JSON line: heartbeat round trip `p50_ms`, `p99_ms`, `max_ms`;
`due` and `sent` (a beat is skipped when a late reply held it past its
period); `lost` (no 2xx within the 1 s period, a network error, or
skipped); and,
to read them by, `send_lag_p99_ms` (how late the generator sent, against
plan), `healthz_p99_ms` (an unsigned GET /healthz probed 10 times a second
on the same server: what the machine and HTTP alone cost at that moment),
the coordinator's and the generator's CPU seconds, and the load average of
this (possibly shared) machine. Targets: `p99_ms <= 50`, `lost == 0`.

    .venv/bin/python bench/coordinator.py [--agents 1000] [--duration-s 60] [--store-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from eth_account import Account

from shoal.client.http import CoordinatorClient
from shoal.client.identity import sign_request
from shoal.spec.coordinator import AgentRegistration, Backend, Heartbeat, Preflight, Registration

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.history, as a script
from bench.history import RECORD_HELP, append_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
AUDIENCE = "shoal-bench"
PERIOD_S = 1.0  # each agent beats once a second
REPLY_WAIT_S = 10.0  # a reply later than this is given up on (and the beat lost)
PROBE_HZ = 10
TARGETS = {"p99_ms_max": 50.0, "lost_max": 0}
BODY = Heartbeat().model_dump_json().encode()


def coordinator_app():  # noqa: ANN201 - uvicorn's --factory entry, settings from the environment
    """The served app: `uvicorn --factory bench.coordinator:coordinator_app`."""
    from shoal.coordinator import Coordinator, CoordinatorSettings, create_app

    return create_app(Coordinator(CoordinatorSettings()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(store_url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "SHOAL_COORDINATOR_STORE_URL": store_url,
           "SHOAL_COORDINATOR_AUDIENCE": AUDIENCE, "SHOAL_COORDINATOR_HEARTBEAT_S": str(PERIOD_S),
           "SHOAL_COORDINATOR_PORT": str(port),
           # Every simulated agent sends from 127.0.0.1 here; on a market each is its own
           # address. The per-key quota (each agent its own key) still applies.
           "SHOAL_COORDINATOR_ADDRESS_QUOTA": ""}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "bench.coordinator:coordinator_app",
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            raise SystemExit(f"the coordinator exited with {server.returncode}")
        time.sleep(0.2)
    server.kill()
    raise SystemExit("the coordinator did not answer /healthz within 60 s")


def register(url: str, index: int):  # noqa: ANN201
    """One provider and its agent, as a real provider would register them."""
    account = Account.create()
    with CoordinatorClient(url, account) as client:
        client.register(Registration(role="provider", name=f"bench-{index}"))
        client.register_agent(AgentRegistration(
            agent_id=agent_id(index), region="eu",
            devices=(Preflight(device_kind="cpu", speed_samples_per_s=100.0, memory_gb=4.0,
                               backend=Backend.gloo, collective_ok=True),)))
    return account


def signing_time_s(account) -> float:  # noqa: ANN001
    """Seconds one signature takes here now, to plan the start after all are signed."""
    start = time.perf_counter()
    for _ in range(200):
        sign_request(account, AUDIENCE, "POST", "/", BODY)
    return (time.perf_counter() - start) / 200


def agent_id(index: int) -> str:
    return f"agent-{index:05d}"


@dataclass
class Beat:
    planned_s: float  # wall time it is due, and the time it is signed with
    request: bytes
    sent_lag_s: float = 0.0
    sent: bool = False  # False: a previous reply came so late that this beat was skipped
    round_trip_s: float | None = None  # None: no reply (network error or given up)
    status: int = 0


@dataclass
class Agent:
    index: int
    beats: list[Beat] = field(default_factory=list)


def plan(accounts: list, port: int, start_s: float, duration_s: int) -> list[Agent]:
    """Every beat of every agent, signed and framed ahead of time, agent i at phase i/n."""
    agents = []
    for index, account in enumerate(accounts):
        phase_s = PERIOD_S * index / len(accounts)
        target = f"/v1/agents/{agent_id(index)}/heartbeat"
        agent = Agent(index)
        for k in range(duration_s):
            planned = start_s + phase_s + k * PERIOD_S
            headers = sign_request(account, AUDIENCE, "POST", target, BODY, now_s=planned)
            lines = [f"POST {target} HTTP/1.1", f"host: 127.0.0.1:{port}",
                     "content-type: application/json", f"content-length: {len(BODY)}",
                     *(f"{name}: {value}" for name, value in headers.items())]
            agent.beats.append(Beat(planned, ("\r\n".join(lines) + "\r\n\r\n").encode() + BODY))
        agents.append(agent)
    return agents


async def read_reply(reader: asyncio.StreamReader) -> int:
    """One HTTP/1.1 response with a content-length (uvicorn's JSON replies); its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(line.split(":", 1)[1]) for line in lines
                   if line.lower().startswith("content-length:")), 0)
    await reader.readexactly(length)
    return int(lines[0].split(" ", 2)[1])


async def run_agent(agent: Agent, port: int, wall_to_loop: float) -> None:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for beat in agent.beats:
        await asyncio.sleep(max(0.0, beat.planned_s + wall_to_loop - loop.time()))
        beat.sent_lag_s = loop.time() - (beat.planned_s + wall_to_loop)
        if beat.sent_lag_s > PERIOD_S:
            continue  # the next beat is due already: this one is skipped, and lost
        beat.sent = True
        sent = time.perf_counter()
        try:
            writer.write(beat.request)
            beat.status = await asyncio.wait_for(read_reply(reader), REPLY_WAIT_S)
            beat.round_trip_s = time.perf_counter() - sent
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ValueError, IndexError):
            writer.close()  # the connection's state is unknown: start a fresh one
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()


async def probe(port: int, until_s: float, wall_to_loop: float) -> list[float]:
    """Unsigned GET /healthz round trips: the server's floor under the same load."""
    loop = asyncio.get_running_loop()
    request = f"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n".encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    while loop.time() < until_s + wall_to_loop:
        sent = time.perf_counter()
        writer.write(request)
        await read_reply(reader)
        times.append(time.perf_counter() - sent)
        await asyncio.sleep(1 / PROBE_HZ)
    writer.close()
    return times


async def drive(agents: list[Agent], port: int, start_s: float, end_s: float) -> list[float]:
    loop = asyncio.get_running_loop()
    wall_to_loop = loop.time() - time.time()
    await asyncio.sleep(max(0.0, start_s - 0.5 - time.time()))
    probing = asyncio.create_task(probe(port, end_s, wall_to_loop))
    await asyncio.gather(*(run_agent(agent, port, wall_to_loop) for agent in agents))
    return await probing


def quantile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(agents: list[Agent], probes: list[float], store: str, duration_s: int) -> dict:
    beats = [beat for agent in agents for beat in agent.beats]
    answered = [b.round_trip_s for b in beats if b.round_trip_s is not None]
    lost = [b for b in beats if b.round_trip_s is None or b.round_trip_s > PERIOD_S
            or not 200 <= b.status < 300]
    statuses: dict[str, int] = {}
    for beat in beats:
        statuses[str(beat.status or "none")] = statuses.get(str(beat.status or "none"), 0) + 1
    p99 = quantile_ms(answered, 0.99)
    return {"bench": "coordinator_heartbeats", "store": store, "agents": len(agents),
            "duration_s": duration_s, "period_s": PERIOD_S, "due": len(beats),
            "sent": sum(b.sent for b in beats), "lost": len(lost),
            "statuses": statuses, "p50_ms": quantile_ms(answered, 0.50), "p99_ms": p99,
            "max_ms": quantile_ms(answered, 1.0),
            "send_lag_p99_ms": quantile_ms([b.sent_lag_s for b in beats if b.sent], 0.99),
            "healthz_p99_ms": quantile_ms(probes, 0.99),
            "targets": TARGETS, "p99_ok": p99 <= TARGETS["p99_ms_max"],
            "lost_ok": len(lost) <= TARGETS["lost_max"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--duration-s", type=int, default=60)
    parser.add_argument("--store-url", default=None,
                        help="default: a fresh SQLite file; or a postgresql URL of an empty database")
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        store_url = args.store_url or f"sqlite:///{tmp}/store.db"
        port = free_port()
        server = serve(store_url, port)
        try:
            url = f"http://127.0.0.1:{port}"
            t = time.monotonic()
            with ThreadPoolExecutor(4) as pool:
                accounts = list(pool.map(lambda i: register(url, i), range(args.agents)))
            print(f"registered {args.agents} providers and agents in "
                  f"{time.monotonic() - t:.1f} s", file=sys.stderr)
            start_s = time.time() + 1.5 * signing_time_s(accounts[0]) * args.agents * args.duration_s + 3.0
            agents = plan(accounts, port, start_s, args.duration_s)
            gc.collect()
            gc.freeze()  # the planned beats: no full collection of them stalls the generator
            if time.time() > start_s - 1.0:
                raise SystemExit("signing overran the planned start; rerun on a quieter machine")
            print(f"signed {args.agents * args.duration_s} beats; beating for "
                  f"{args.duration_s} s", file=sys.stderr)
            load_before, server_cpu, own_cpu = os.getloadavg()[0], cpu_s(server.pid), time.process_time()
            probes = asyncio.run(drive(agents, port, start_s, start_s + args.duration_s))
            result = summary(agents, probes, store_url.split(":", 1)[0].split("+")[0],
                             args.duration_s)
            result.update(
                coordinator_cpu_s=round(cpu_s(server.pid) - server_cpu, 1),
                generator_cpu_s=round(time.process_time() - own_cpu, 1),
                load_avg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
                cores=os.cpu_count())
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(json.dumps(result))
    if args.record:
        append_result("coordinator", result)


if __name__ == "__main__":
    main()
