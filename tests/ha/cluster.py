"""A pg_auto_failover formation on loopback: a monitor, a primary and a secondary with
synchronous replication, as Debian's ``postgresql-15-auto-failover`` runs it.

Everything lives in one temporary folder owned by the ``postgres`` user, since Postgres
refuses to run as root: each ``pg_autoctl`` runs as that user (``runuser`` when we are
root), with its configuration and state in that folder (``XDG_CONFIG_HOME``,
``XDG_DATA_HOME``), every server listening on 127.0.0.1 only, on free ports, with its
socket in that folder. Each node's ``pg_autoctl run`` is its own process group:
``kill_node`` SIGKILLs the group, the keeper and its postmaster at once, as a host that
dies (a keeper left alive would restart its postmaster before anyone noticed).

The monitor's health checks are tightened (pg_auto_failover's defaults wait about 20 s
before they call a node unhealthy, and 30 s for a demotion) so that a failover takes a
few seconds, as an operator who wants one sets them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")

# The monitor's settings (milliseconds): a node that answers no health check, and whose
# keeper has not reported for a few seconds, is failed over.
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 2000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 200,
    # Keepers report every second: more than that, so that a busy machine's late report
    # alone fails nothing over.
    "pgautofailover.node_considered_unhealthy_timeout": 2500,
    "pgautofailover.primary_demote_timeout": 1000,
}

DATABASE = "compactd"
ROLE = "compactd"


def pg_autoctl_binary() -> str | None:
    found = shutil.which("pg_autoctl")
    if found is None or not (PG_BIN / "pg_ctl").exists():
        return None
    return found


@dataclass
class Node:
    name: str
    port: int
    pgdata: Path
    process: subprocess.Popen[bytes] | None = None


@dataclass
class Formation:
    folder: Path
    binary: str
    monitor_port: int
    nodes: list[Node] = field(default_factory=list)
    monitor: subprocess.Popen[bytes] | None = None

    # -- running pg_autoctl and psql as postgres ------------------------------------------

    def _env(self) -> dict[str, str]:
        return {
            "PATH": f"{PG_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.folder),
            "XDG_CONFIG_HOME": str(self.folder / "config"),
            "XDG_DATA_HOME": str(self.folder / "share"),
            "PG_REGRESS_SOCK_DIR": str(self.folder),
            "PGHOST": "127.0.0.1",
            "LANG": "C.UTF-8",
        }

    def _argv(self, *argv: str) -> list[str]:
        if os.geteuid() == 0:
            return [shutil.which("runuser") or "/usr/sbin/runuser", "-u", "postgres", "--", *argv]
        return list(argv)

    def run(self, *argv: str, timeout: float = 120) -> str:
        done = subprocess.run(
            self._argv(*argv),
            env=self._env(),
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def spawn(self, log: str, *argv: str) -> subprocess.Popen[bytes]:
        with (self.folder / log).open("ab") as out:
            return subprocess.Popen(
                self._argv(*argv),
                env=self._env(),
                cwd=self.folder,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def sql(self, port: int, statement: str, database: str = "postgres") -> str:
        return self.run(
            "psql", "-XAtq", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
            "-d", database, "-v", "ON_ERROR_STOP=1", "-c", statement,
        ).strip()  # fmt: skip

    # -- what the tests read --------------------------------------------------------------

    def uri(self) -> str:
        """The formation's multi-host URI for the service's role and database, as
        ``pg_autoctl show uri`` gives it (with ``target_session_attrs=read-write``)."""
        return self.run(
            self.binary, "show", "uri", "--formation", "default",
            "--pgdata", str(self.folder / "monitor"),
        ).strip()  # fmt: skip

    def state(self) -> str:
        return self.run(self.binary, "show", "state", "--pgdata", str(self.folder / "monitor"))

    def states(self) -> dict[str, str]:
        """Each node's current state as the monitor sees it."""
        rows = self.sql(
            self.monitor_port,
            "SELECT nodename || '=' || reportedstate FROM pgautofailover.node",
            database="pg_auto_failover",
        )
        return dict(line.split("=", 1) for line in rows.splitlines() if "=" in line)

    def pair(self, timeout: float = 60) -> tuple[Node, Node]:
        """The primary and its secondary, once the formation has both."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            for primary, standby in (self.nodes, self.nodes[::-1]):
                if (states.get(primary.name), states.get(standby.name)) == (
                    "primary",
                    "secondary",
                ):
                    return primary, standby
            if time.monotonic() > deadline:
                raise RuntimeError(f"no primary and secondary:\n{self.state()}")
            time.sleep(0.1)

    def wait_for(self, wanted: dict[str, str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            if all(states.get(name) == state for name, state in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the formation is {states}, not {wanted}:\n{self.state()}")
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(
            f"== {log.name}\n{log.read_text(errors='replace')[-4000:]}"
            for log in sorted(self.folder.glob("*.log"))
        )

    # -- building it ----------------------------------------------------------------------

    def start_monitor(self) -> None:
        pgdata = self.folder / "monitor"
        self.run(
            self.binary, "create", "monitor", "--pgdata", str(pgdata),
            "--pgport", str(self.monitor_port), "--hostname", "127.0.0.1",
            "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl",
            "--pgctl", str(PG_BIN / "pg_ctl"),
        )  # fmt: skip
        self.monitor = self.spawn("monitor.log", self.binary, "run", "--pgdata", str(pgdata))
        _wait_for_port(self.monitor_port, self.monitor, self)
        for name, value in MONITOR_SETTINGS.items():
            self.sql(self.monitor_port, f"ALTER SYSTEM SET {name} = {value}")
        self.sql(self.monitor_port, "SELECT pg_reload_conf()")

    def add_node(self, name: str, port: int) -> Node:
        node = Node(name, port, self.folder / name)
        monitor = f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"
        self.run(
            self.binary, "create", "postgres", "--pgdata", str(node.pgdata),
            "--pgport", str(port), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
            "--name", name, "--dbname", DATABASE, "--auth", "trust", "--no-ssl",
            "--monitor", monitor, "--pgctl", str(PG_BIN / "pg_ctl"),
            "--replication-quorum", "true", "--candidate-priority", "50",
            timeout=180,
        )  # fmt: skip
        node.process = self.spawn(f"{name}.log", self.binary, "run", "--pgdata", str(node.pgdata))
        self.nodes.append(node)
        return node

    def kill_node(self, node: Node) -> None:
        """SIGKILL the node's keeper and its postmaster (their process group) at once."""
        assert node.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(10)
        _kill_postmaster(node.pgdata)  # one outside the group, if any

    def stop(self) -> None:
        for process in [n.process for n in self.nodes] + [self.monitor]:
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in [n.process for n in self.nodes] + [self.monitor]:
            if process is None:
                continue
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        for pgdata in [self.folder / "monitor", *(n.pgdata for n in self.nodes)]:
            _kill_postmaster(pgdata)


def _kill_postmaster(pgdata: Path) -> None:
    """SIGKILL the postmaster of ``pgdata`` if one still runs (its pid file stays after
    a SIGKILL: the pid is checked to be a postgres of that folder, not a reused one)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
        if str(pgdata).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], formation: Formation) -> None:
    """Until the server on ``port`` accepts connections (listening is not enough: it
    refuses them while it starts up)."""
    ready = [str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-t", "1"]
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"pg_autoctl exited ({process.returncode}):\n{formation.logs()}")
        if subprocess.run(ready, check=False, timeout=10).returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on {port}:\n{formation.logs()}")
        time.sleep(0.1)


@contextlib.contextmanager
def running_formation(binary: str, ports: list[int]) -> Iterator[Formation]:
    """A monitor and two nodes (``node1`` primary, ``node2`` its synchronous secondary),
    the ``compactd`` database and role made on the primary; stopped and removed after."""
    folder = Path(tempfile.mkdtemp(prefix="compactd-ha-"))
    if os.geteuid() == 0:
        record = pwd.getpwnam("postgres")
        os.chown(folder, record.pw_uid, record.pw_gid)
    formation = Formation(folder, binary, ports[0])
    try:
        formation.start_monitor()
        formation.add_node("node1", ports[1])
        formation.wait_for({"node1": "single"}, timeout=120)
        formation.add_node("node2", ports[2])
        formation.wait_for({"node1": "primary", "node2": "secondary"}, timeout=180)
        formation.sql(ports[1], f"CREATE ROLE {ROLE} LOGIN")
        formation.sql(ports[1], f"ALTER DATABASE {DATABASE} OWNER TO {ROLE}")
        formation.sql(ports[1], f"GRANT ALL ON SCHEMA public TO {ROLE}", database=DATABASE)
        formation.sql(ports[1], f"ALTER SCHEMA public OWNER TO {ROLE}", database=DATABASE)
        yield formation
    finally:
        formation.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # python -m tests.ha.cluster: build one, fail it over, time it
    from tests.e2e.server import free_port

    found = pg_autoctl_binary()
    assert found is not None, "pg_autoctl is not installed"
    started = time.monotonic()
    with running_formation(found, [free_port() for _ in range(3)]) as f:
        print(f"formation up in {time.monotonic() - started:.1f} s: {f.uri()}")
        print(f.state())
        primary, standby = f.pair()
        killed = time.monotonic()
        f.kill_node(primary)
        f.wait_for({standby.name: "wait_primary"}, timeout=120)
        print(f"{standby.name} promoted {time.monotonic() - killed:.1f} s after the kill")
        print(f.state())
