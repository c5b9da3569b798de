"""One process per run folder: a lock file holding the owner's PID and host.

``RunLock(folder)`` creates ``folder/.lock`` atomically (a complete temp file
hard-linked into place, which fails if the lock exists) with the owner's pid,
host, process start time and a random token. A second process is refused with
:class:`RunLocked`, whose message names the holder. A lock left by a process of
this host that is gone (no such pid, or the pid now belongs to a process started
later) is taken over: it is renamed aside, checked to be the very lock judged
stale, and removed. The holder refreshes the lock's mtime every ``HEARTBEAT_S``
from a background thread; a lock from another host (whose process cannot be
checked from here: a job retried on another node after its node died) is taken
over only once its heartbeat is older than ``STALE_AFTER_S``; until then the
message names the holder and the file to delete once that process is known to be
gone. Under SLURM the lock also records the job id, and a retry (a new job, on any
node) need not wait that long after a hard kill (OOM, SIGKILL past KillWait): another
host's lock is taken over when its job is this very job (requeued: its earlier run
is gone), when ``squeue`` no longer shows that job running, or when its heartbeat is
older than ``SLURM_STALE_AFTER_S``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from mwm.io import current_umask

__all__ = ["RunLock", "RunLocked", "LOCK_NAME", "proc_start", "pid_alive", "slurm_job_state"]

LOCK_NAME = ".lock"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 900.0
#: Under SLURM: three missed heartbeats. A live holder refreshes its lock every HEARTBEAT_S.
SLURM_STALE_AFTER_S = 3 * HEARTBEAT_S
#: squeue states of a job whose processes may still run.
_SLURM_LIVE = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
               "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


class RunLocked(RuntimeError):
    """The run folder is held by another live process; the message names it."""


def proc_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def slurm_job_state(job_id: str) -> str | None:
    """``squeue``'s state of a SLURM job: "" when squeue no longer knows it, None when squeue cannot
    tell (not installed, no controller, a timeout)."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return "" if "invalid job id" in out.stderr.lower() else None
    return out.stdout.strip().split("\n")[0].strip()


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts)."""
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
                "proc_start": proc_start(os.getpid()), "token": self.token,
                "slurm_job": os.environ.get("SLURM_JOB_ID")}

    @staticmethod
    def _read(path: Path) -> dict | None:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _age(self) -> float | None:
        try:
            return time.time() - self.path.stat().st_mtime
        except OSError:
            return None

    @staticmethod
    def _stale_after(holder: dict) -> float:
        """Seconds without a heartbeat after which another host's lock is stale."""
        return SLURM_STALE_AFTER_S if holder.get("slurm_job") else STALE_AFTER_S

    def _stale(self, holder: dict) -> bool:
        if holder.get("host") != self.host:
            age = self._age()
            job = holder.get("slurm_job")
            if job:
                if job == os.environ.get("SLURM_JOB_ID"):
                    return True  # this job requeued: its earlier run, on that host, is gone
                state = slurm_job_state(job)
                if state == "" or (state and state.split()[0] not in _SLURM_LIVE):
                    return True
            return age is not None and age > self._stale_after(holder)
        if not isinstance(holder.get("pid"), int):
            return False
        pid = holder["pid"]
        if not pid_alive(pid):
            return True
        start = holder.get("proc_start")
        return start is not None and proc_start(pid) not in (None, start)

    def describe(self, holder: dict) -> str:
        who = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        if holder.get("slurm_job"):
            who += f", SLURM job {holder['slurm_job']}"
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
                self._start_heartbeat()
                return self
            holder = self._read(self.path)
            if holder is None:
                continue  # released meanwhile
            if holder == {}:  # unreadable: never a partial write (linked whole); refuse
                raise RunLocked(f"{self.folder} is locked by {self.path}, which is unreadable; delete it if "
                                f"no process is using the run")
            if not self._stale(holder):
                age = self._age() or 0.0
                advice = ("wait for it to finish or stop it" if holder.get("host") == self.host else
                          f"its last heartbeat was {age:.0f} s ago; it is taken over after "
                          f"{self._stale_after(holder):.0f} s "
                          f"without one, or delete {self.path} once that process is known to be gone")
                raise RunLocked(f"{self.folder} is in use by {self.describe(holder)} (lock {self.path}); "
                                f"{advice}")
            print(f"taking over the stale lock {self.path} of {self.describe(holder)}, which is gone "
                  f"(no such process, or no heartbeat for {STALE_AFTER_S:.0f} s)", flush=True)
            self._break(holder)
        raise RunLocked(f"could not take the lock {self.path}: other processes keep taking it")

    def _start_heartbeat(self) -> None:
        self._stop = threading.Event()
        token = self.token

        def beat():
            while not self._stop.wait(HEARTBEAT_S):
                if (self._read(self.path) or {}).get("token") != token:
                    return  # no longer ours
                try:
                    os.utime(self.path)
                except OSError:
                    pass

        threading.Thread(target=beat, name="mwm-lock-heartbeat", daemon=True).start()

    def release(self) -> None:
        if getattr(self, "_stop", None) is not None:
            self._stop.set()
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
