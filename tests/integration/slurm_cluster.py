"""A real one-node SLURM cluster for the tests: munged, slurmctld and slurmd started in a
temporary folder, with their own key, configuration, state, spool and logs, and stopped by PID.

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them) run it as root:
``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none`` (no cgroups needed), the node
declared with this machine's CPUs, no accounting daemon (``sacct`` has no database; jobs stay
visible to ``scontrol show job`` for ``MinJobAge`` seconds after they end). The clients find
the cluster through ``SLURM_CONF`` in :attr:`SlurmCluster.env`; nothing is written outside the
folder, and the machine's own ``/etc/slurm`` and ``/etc/munge`` are not read.

:func:`why_no_cluster` says why one cannot start here (not root, a program missing, a host
name the workers could not resolve); the fixture skips with that reason outside CI and fails
under ``CI`` (``.ci/run`` must run these tests).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel")
START_S = 60  # the daemons answer within a few seconds here; generous for a loaded CI machine
# A requeued job may start again once its old credential has expired: SLURM holds it that long
# (EligibleTime). 120 s by default; 10 s here, with the scheduler looking every 2 s (60 s by
# default), so that a requeued job restarts on its own within seconds.
CRED_EXPIRE_S = 10


def node_name() -> str:
    """The name slurmd registers under: the short host name (what ``hostname -s`` prints)."""
    return socket.gethostname().split(".")[0]


def why_no_cluster() -> str | None:
    """None if a cluster can start here, else the reason in words."""
    if os.geteuid() != 0:
        return "a test SLURM cluster runs its daemons as root (SlurmUser=root); not root here"
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"{', '.join(missing)} not found: install Debian's slurm-wlm and munge (.ci/run does)"
    try:
        socket.gethostbyname(node_name())
    except OSError as e:
        return f"host name {node_name()!r} does not resolve ({e}): the workers address each other by node name"
    return None


def free_port_pair() -> int:
    """A port p with p and p+1 free on this machine now (slurmctld, slurmd)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("", 0))
            p = s.getsockname()[1]
        if p >= 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("", p))
                b.bind(("", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two consecutive free TCP ports found")


def _mem_mb() -> int:
    with open("/proc/meminfo") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    return int(total_kb / 1024 * 0.9)  # what slurmd -C reports, less a margin for the system


class SlurmCluster:
    """A running one-node cluster in ``folder`` (see the module doc); a context manager."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.node = node_name()
        self.cpus = os.cpu_count() or 1
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for var in [v for v in self.env if v.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if var != "SLURM_CONF":
                del self.env[var]  # a job's own variables (the tests under SLURM) must not leak in
        self._procs: list[tuple[str, subprocess.Popen]] = []

    # -- start and stop ---------------------------------------------------------------------

    def _write_config(self) -> None:
        f = self.folder
        for sub in ("munge", "state", "spool", "log", "run"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        (f / "munge").chmod(0o755)  # clients reach the socket; the key has its own mode
        key = f / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        port = free_port_pair()
        self.conf.write_text(f"""\
ClusterName=bratsseg
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={port}
SlurmdPort={port + 1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={f}/munge/munge.socket,cred_expire={CRED_EXPIRE_S}
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/run/slurmctld.pid
SlurmdPidFile={f}/run/slurmd.pid
SlurmctldLogFile={f}/log/slurmctld.log
SlurmdLogFile={f}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobRequeue=1
ReturnToService=2
MinJobAge=900
KillWait=30
InactiveLimit=0
MailProg=/bin/true
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={_mem_mb()} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.folder / "log" / f"{name}.out", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()
        self._procs.append((name, proc))

    def start(self) -> SlurmCluster:
        self._write_config()
        f = self.folder
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={f}/munge/munge.socket",
                f"--key-file={f}/munge/munge.key",
                f"--log-file={f}/log/munged.log",
                f"--pid-file={f}/run/munged.pid",
                f"--seed-file={f}/munge/munged.seed",
            ],
        )
        self._wait(lambda: (f / "munge" / "munge.socket").exists(), "munged's socket")
        # -c: no state from an earlier cluster; -D: in the foreground, so the PID is ours
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(
            lambda: self.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip() == "idle",
            "the node to be idle in sinfo",
        )
        return self

    def _wait(self, ready, what: str) -> None:
        end = time.monotonic() + START_S
        while time.monotonic() < end:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {START_S} s waiting for {what}:\n{self.logs()}")

    def stop(self) -> None:
        """Cancel every job, wait for them to go, then stop the daemons (newest first) by PID."""
        try:
            if any(name == "slurmctld" and p.poll() is None for name, p in self._procs):
                self.run("scancel", "--user", "root", check=False)
                end = time.monotonic() + 60
                while time.monotonic() < end and self.run("squeue", "-h", check=False).stdout.strip():
                    time.sleep(0.5)
        finally:
            for _name, proc in reversed(self._procs):
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            self._procs.clear()

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- using it ---------------------------------------------------------------------------

    def run(self, *cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, env=kw.pop("env", self.env), timeout=kw.pop("timeout", 60), **kw
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr.strip()}")
        return done

    def sbatch(self, *args: str, cwd: Path, env: dict | None = None) -> str:
        """Submit; the job's id."""
        done = self.run("sbatch", "--parsable", *args, cwd=cwd, env={**self.env, **(env or {})})
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Reason, Restarts, ExitCode, ...); {} once gone."""
        done = self.run("scontrol", "show", "job", "--oneliner", job_id, check=False)
        if done.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout))

    def wait_job(self, job_id: str, ready, what: str, timeout: float) -> dict[str, str]:
        """Poll ``job(job_id)`` until ``ready(fields)``; the fields then."""
        end = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < end:
            fields = self.job(job_id)
            if fields and ready(fields):
                return fields
            time.sleep(0.5)
        raise AssertionError(f"job {job_id}: {what} not seen within {timeout:.0f} s; last seen {fields}\n{self.logs()}")

    def logs(self, lines: int = 30) -> str:
        out = []
        for path in sorted((self.folder / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(out)
