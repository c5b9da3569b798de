"""One process per run folder: a lock file holding the owner's PID and host.

``RunLock(folder)`` creates ``folder/.lock`` atomically (a complete temp file
hard-linked into place, which fails if the lock exists) with the owner's pid,
host, process start time and a random token. A second process is refused with
:class:`RunLocked`, whose message names the holder. A lock left by a process of
this host that is gone (no such pid, or the pid now belongs to a process started
later) is taken over: it is renamed aside, checked to be the very lock judged
stale, and removed; a lock from another host is never broken (its process cannot
be checked from here): the message says which file to delete once that process is
known to be gone.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

from .io import current_umask

__all__ = ["RunLock", "RunLocked", "LOCK_NAME"]

LOCK_NAME = ".lock"


class RunLocked(RuntimeError):
    """The run folder is held by another live process; the message names it."""


def _proc_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    def __init__(self, folder: str | Path, acquire: bool = True):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.host = socket.gethostname()
        self.token = None
        if acquire:
            self.acquire()

    # -- holder ----------------------------------------------------------------------
    def _content(self) -> dict:
        return {"pid": os.getpid(), "host": self.host, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "proc_start": _proc_start(os.getpid()), "token": self.token}

    @staticmethod
    def _read(path: Path) -> dict | None:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _stale(self, holder: dict) -> bool:
        if holder.get("host") != self.host or not isinstance(holder.get("pid"), int):
            return False
        pid = holder["pid"]
        if not _alive(pid):
            return True
        start = holder.get("proc_start")
        return start is not None and _proc_start(pid) not in (None, start)

    def describe(self, holder: dict) -> str:
        who = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        if holder.get("started"):
            who += f" (since {holder['started']})"
        return who

    # -- acquire / release -----------------------------------------------------------------
    def _try_create(self) -> bool:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(8)
        fd, tmp = tempfile.mkstemp(prefix=".lock.", suffix=".tmp", dir=self.folder)
        try:
            os.fchmod(fd, 0o666 & ~current_umask())  # teammates can read who holds it
            with os.fdopen(fd, "w") as fh:
                json.dump(self._content(), fh)
            os.link(tmp, self.path)  # atomic; fails when the lock exists
            return True
        except FileExistsError:
            self.token = None
            return False
        finally:
            os.unlink(tmp)

    def _break(self, holder: dict) -> None:
        """Remove the stale lock ``holder`` (and only it, should another process have
        replaced it meanwhile)."""
        aside = self.folder / f".lock.stale.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # someone else removed it first
        if self._read(aside) == holder:
            os.unlink(aside)
            return
        try:  # a fresh lock of another process: put it back
            os.link(aside, self.path)
        except FileExistsError:
            pass
        os.unlink(aside)

    def acquire(self) -> "RunLock":
        for _ in range(20):
            if self._try_create():
                return self
            holder = self._read(self.path)
            if holder is None:
                continue  # released meanwhile
            if holder == {}:  # unreadable: never a partial write (linked whole); refuse
                raise RunLocked(f"{self.folder} is locked by {self.path}, which is unreadable; delete it if "
                                f"no process is using the run")
            if not self._stale(holder):
                advice = (f"wait for it to finish or stop it" if holder.get("host") == self.host else
                          f"if that process is gone, delete {self.path}")
                raise RunLocked(f"{self.folder} is in use by {self.describe(holder)} (lock {self.path}); "
                                f"{advice}")
            print(f"taking over the stale lock {self.path} of {self.describe(holder)}, which is gone",
                  flush=True)
            self._break(holder)
        raise RunLocked(f"could not take the lock {self.path}: other processes keep taking it")

    def release(self) -> None:
        if self.token is not None and (self._read(self.path) or {}).get("token") == self.token:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self.token = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
