"""A throwaway PostgreSQL server for the tests: Debian's `postgresql` binaries, a fresh
cluster in a temporary directory, on a free loopback port, stopped at the end.

PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres` user
that Debian's package creates.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


class Unavailable(RuntimeError):
    pass


def binaries() -> Path:
    """The directory with initdb and pg_ctl: on PATH, or Debian's versioned one."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not versions:
        raise Unavailable("no PostgreSQL server binaries (initdb): `apt-get install postgresql` "
                          "(setup.sh --test does it)")
    return Path(versions[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """`with PostgresServer() as pg:` a running server; `pg.new_database()` an empty one."""

    def __init__(self, fsync: bool = False):
        # Not under pytest's tmp dirs: those are private to root, and the server runs as postgres.
        self.bin, self.port, self.fsync = binaries(), free_port(), fsync
        self.root = Path(tempfile.mkdtemp(prefix="evolve-pg-"))
        self.data, self.created = self.root / "data", 0
        self.user = "postgres" if os.getuid() == 0 else None

    def _run(self, *args: str) -> str:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise Unavailable(f"{args[0]} failed: {(done.stderr or done.stdout).strip()[-500:]}")
        return done.stdout

    def __enter__(self) -> "PostgresServer":
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        # trust on loopback: a throwaway cluster that only this test session can reach
        self._run("initdb", "-D", str(self.data), "-U", "evolve", "-A", "trust", "-E", "UTF8", "--no-sync")
        self.start()
        return self

    def start(self) -> None:
        # fsync off for tests: a test server need not survive a power cut, only a restart
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                  f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=200", "start")

    def running(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.data), "status")
            return True
        except Unavailable:
            return False

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def __exit__(self, *exc) -> None:
        try:
            self.stop("immediate")
        except Unavailable:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://evolve@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database's URL."""
        import psycopg

        self.created += 1
        name = f"t{self.created}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=evolve dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)
