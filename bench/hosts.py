"""host-kill and partition for shoal and torchft: every worker, every warm
spare and the control plane of each system on a network-namespaced host of
its own (tests/harness/netns), the same plan driven against both.

Hosts: `ctl` (shoal's store and authority, bench.authority_host; torchft's
lighthouse), h0..h{W-1} (one trainer each), s0..s{K-1} (one warm spare per
fault, started with the job, called in right after its fault). A host-kill
SIGKILLs every process of the host (shoal's launcher with its worker); a
partition disables the host's bridge port (no FIN, no RST) and is never
healed during the run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from shoal.spec import load_job

from bench.fault_plan import FaultPlan, drive
from bench.figures import Commit, figures_of, summary
from bench.shoal_side import scratch_dir, shoal_detection
from tests.harness.netns import Host, Network, ensure_tools

PORT = 29500
REPO = Path(__file__).resolve().parents[1]


class Hosts:
    """ctl, one host per worker and one per spare. Each host also has a hostname of its own
    (a UTS namespace per process tree), known to every host's /etc/hosts: torchft advertises
    its store, gloo and HTTP endpoints by hostname, and a hostname shared by all namespaces
    would resolve to each peer's own address."""

    def __init__(self, workers: int, spares: int) -> None:
        ensure_tools()
        self.network = Network()
        self._etc: list[Path] = []
        names = ["ctl"] + [f"h{i}" for i in range(workers)] + [f"s{k}" for k in range(spares)]
        self.by_name: dict[str, Host] = {}
        try:
            for name in names:
                self.by_name[name] = self.network.add_host(name)
            table = "127.0.0.1 localhost\n" + "".join(
                f"{host.address} {name}\n" for name, host in self.by_name.items())
            for host in self.by_name.values():
                # `ip netns exec` bind-mounts /etc/netns/<namespace>/* over /etc.
                etc = Path("/etc/netns") / host.namespace
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(table)
                self._etc.append(etc)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name: str) -> Host:
        return self.by_name[name]

    def popen(self, name: str, command: list[str], **kwargs):
        """Start `command` on host `name`, under that hostname."""
        named = ["unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh", *command]
        return self.by_name[name].popen(named, **kwargs)

    def close(self) -> None:
        self.network.close()
        for etc in self._etc:
            (etc / "hosts").unlink(missing_ok=True)
            etc.rmdir()


def host_of(worker_id: str) -> str:
    """shoal ids are NODE-w<i>; torchft replica ids are the host names themselves."""
    return worker_id.split("-w")[0]


class HostFaults:
    """What the fault driver needs of a namespaced run; `holder(rank)` names the worker."""

    def __init__(self, hosts: Hosts, holder, call_spare) -> None:
        self.hosts, self.holder, self.call_spare = hosts, holder, call_spare
        self.launch_t = time.time()
        self.check = lambda: None

    def healthy(self) -> None:
        self.check()

    def victim_pids(self, rank: int, whole_host: bool) -> list[int]:
        return self.hosts[host_of(self.holder(rank))].pids()  # every process of the host

    def partition(self, rank: int) -> None:
        self.hosts[host_of(self.holder(rank))].partition()

    def replace(self, k: int) -> None:
        self.call_spare(k)


def shoal_on_hosts(job_path: str, plan: FaultPlan, steps: int, detect_s: float, run_dir: Path):
    """shoal through `plan` on namespaced hosts; (report, commits, applied, launch_t)."""
    from shoal.elastic.report import build_report
    from shoal.train.rendezvous import Rendezvous, connect
    from shoal.train.step_log import read_step_logs

    job = load_job(job_path, overrides={"steps": steps})
    run_dir.mkdir(parents=True, exist_ok=True)
    hosts = Hosts(plan.workers, plan.count)
    try:
        ctl = hosts["ctl"]
        env = {"SHOAL_CHECKPOINT_DIR": str(run_dir / "ckpt"), "OMP_NUM_THREADS": "1",
               "SHOAL_CHECKPOINT_INTERVAL": str(job.checkpoint.interval_steps),
               "SHOAL_IDENTITY": json.dumps(job.resume_identity()), "TORCH_CPP_LOG_LEVEL": "ERROR"}
        env = {**os.environ, **env}
        authority = hosts.popen("ctl", [sys.executable, "-m", "bench.authority_host", "--bind", ctl.address,
                               "--port", str(PORT), "--run-dir", str(run_dir),
                               "--min-workers", str(plan.workers), "--stall-deadline-s", str(detect_s)],
                              env=env, cwd=REPO, log=run_dir / "authority.out")
        _wait_for(run_dir / "launch.json", authority)
        worker = [str(REPO / "src/shoal/models/gpt_worker.py"), "--", "--job-json", job.model_dump_json()]
        for name, host in hosts.by_name.items():
            if name == "ctl":
                continue
            command = [sys.executable, "-m", "shoal.cli.main", "run", "--workers", "1",
                       "--rendezvous", f"{ctl.address}:{PORT}", "--node", name, "--bind", host.address,
                       "--run-dir", str(run_dir), "--stall-deadline-s", str(detect_s), *worker]
            spare_env = {"SHOAL_SPARE": "1"} if name.startswith("s") else {}
            hosts.popen(name, command, env={**env, **spare_env}, cwd=REPO,
                        log=run_dir / f"launcher-{name}.out")
        rdzv = Rendezvous(connect(ctl.address, PORT, timeout_s=30.0))

        def holder(rank: int) -> str:
            lines = [l for l in (run_dir / "epochs.jsonl").read_text().splitlines() if l.strip()]
            return json.loads(lines[-1])["members"][rank]

        target = HostFaults(hosts, holder, lambda k: rdzv.activate(f"s{k}-w0"))
        target.launch_t = json.loads((run_dir / "launch.json").read_text())["t0"]
        target.check = lambda: _alive(authority, run_dir / "authority.out")
        applied = drive(plan, target)
        deadline = time.time() + plan.end_s * 3 + 300
        while authority.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        records = read_step_logs(run_dir)
        report = build_report(run_dir, [], target.launch_t, final={})
        commits = [Commit(r.step, r.t_start, r.t_commit, r.world, r.epoch) for r in records]
        return report, commits, applied, target.launch_t
    finally:
        hosts.close()


def _wait_for(path: Path, process, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while not path.exists():
        _alive(process, path.parent / "authority.out")
        if time.time() > deadline:
            raise RuntimeError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.05)
    time.sleep(0.05)


def _alive(process, log: Path) -> None:
    if process.poll() is not None:
        raise RuntimeError(f"exited with {process.returncode}: {log.read_text()[-2000:]}")


def torchft_on_hosts(job_path: str, plan: FaultPlan, lighthouse, timeout_s: float, run):
    """torchft through `plan` on namespaced hosts; (commits, applied, launch_t)."""
    from bench.reference.common import commits_of, latest_holder, read_step_logs, worker_env
    from bench.reference.training import cache_corpus, check_workers

    job = check_workers(job_path, plan.workers)
    corpus = cache_corpus(job, run.path)
    hosts = Hosts(plan.workers, plan.count)
    try:
        ctl = hosts["ctl"]
        env = worker_env(GLOO_SOCKET_IFNAME="eth0")
        launch_t = time.time()
        lighthouse_process = hosts.popen("ctl", lighthouse.command(PORT, ctl.address), env=env,
                                       log=run.path / "lighthouse.log")
        (run.path / "spares").mkdir(exist_ok=True)
        base = [sys.executable, "-m", "bench.reference.torchft_worker",
                "--job", str(Path(job_path).resolve()), "--corpus", str(corpus),
                "--run-dir", str(run.path), "--lighthouse", f"http://{ctl.address}:{PORT}",
                "--threads", "1", "--timeout-s", str(timeout_s)]
        for name, host in hosts.by_name.items():
            if name == "ctl":
                continue
            spare = ["--wait-for", str(run.path / "spares" / f"{name}.go")] if name.startswith("s") else []
            hosts.popen(name, base + ["--replica-id", name, "--address", host.address, *spare],
                        env=env, cwd=REPO, log=run.path / f"{name}.log")

        def holder(rank: int) -> str:
            found = latest_holder(read_step_logs(run.logs), rank)
            if found is None:
                raise RuntimeError(f"no torchft replica has held rank {rank}")
            return found

        target = HostFaults(hosts, holder, lambda k: (run.path / "spares" / f"s{k}.go").touch())
        target.launch_t = launch_t
        target.check = lambda: _alive(lighthouse_process, run.path / "lighthouse.log")
        applied = drive(plan, target)
        return commits_of(read_step_logs(run.logs)), applied, launch_t
    finally:
        hosts.close()


def run_on_hosts(job_path: str, plan: FaultPlan, rate: float, args, skip: set[str], log):
    """shoal, then torchft, through `plan` on hosts; (shoal, refs, exact) for bench.elastic."""
    from bench.reference.common import RunDirectory
    from bench.reference.torchft_ref import LighthouseConfig, torchft_detection

    with scratch_dir("shoal-hosts-") as scratch:
        steps = int(rate * plan.end_s * 1.3) + 100
        report, commits, applied, launch_t = shoal_on_hosts(job_path, plan, steps, args.detect_s,
                                                            Path(scratch) / "run")
    shoal = {**summary(figures_of(commits, applied, launch_t, plan)),
             "detection": shoal_detection(args.detect_s), "placement": "one host per worker"}
    exact = {"samples_skipped": report.samples_skipped,
             "samples_duplicated": report.samples_duplicated,
             "replica_mismatches": report.replica_mismatches, "steps_lost": shoal["steps_lost"]}
    log(f"shoal on hosts: rto_s {shoal['rto_s']}, rto_full_s {shoal['rto_full_s']}")
    refs: dict[str, dict] = {"torchrun": {"not_run": (
        "the torchrun harness runs one agent on one host; a multi-node torchrun across "
        "namespaced hosts (one agent per host, c10d rendezvous on ctl, a replacement agent "
        "per lost host) is not built yet, so no figure is given for host faults")}}
    if "torchft" not in skip:
        lighthouse = LighthouseConfig()
        with RunDirectory("torchft-hosts") as run:
            ft_commits, ft_applied, ft_launch = torchft_on_hosts(job_path, plan, lighthouse,
                                                                 args.collective_timeout_s, run)
        refs["torchft"] = {**summary(figures_of(ft_commits, ft_applied, ft_launch, plan)),
                           "detection": torchft_detection(lighthouse, args.collective_timeout_s),
                           "placement": "one host per replica"}
        log(f"torchft on hosts: rto_s {refs['torchft']['rto_s']}, "
            f"rto_full_s {refs['torchft']['rto_full_s']}")
    return shoal, refs, exact
