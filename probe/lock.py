"""One writer per run folder: an advisory ``fcntl.flock`` lock on ``RUN/.probe.lock``.

Two ``probe run`` on one folder would each compute (and, on an API engine,
pay for) every trial. The first takes the lock and writes its pid, host,
start time and command into the lock file; a second one either exits with a
message naming that holder or, asked to wait, blocks until the lock is free.

The kernel drops a ``flock`` lock when its process dies, however it dies
(SIGKILL included), so a lock left by a dead process is simply free: the
next writer takes it and says whose it was (the lock file still names the
dead holder, because only a clean release empties it). The lock file is
never deleted or renamed: a writer waiting on the old inode and a newcomer
locking a new one would both think they hold the folder.

Shards write separate folders and never contend. On shared file systems see
``docs/store.md``: Linux NFS clients turn ``flock`` into NFS byte-range locks
(held across machines when the mount has locking, not with ``nolock`` or
``local_lock=flock``), and Lustre needs the ``flock`` mount option.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from probe.errors import StoreError

LOCK_FILE = ".probe.lock"
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class LockError(StoreError):
    """The run folder cannot be locked (another writer holds it, or the file system has no locks)."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a run folder's lock, as its lock file says."""

    pid: int
    host: str
    since: str
    command: str

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder written in a lock file, or None when it is empty or unreadable (mid-write)."""
        try:
            doc = json.loads(text)
            return cls(int(doc["pid"]), str(doc["host"]), str(doc["since"]), str(doc.get("command", "")))
        except (ValueError, KeyError, TypeError):
            return None

    @classmethod
    def me(cls) -> Holder:
        since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return cls(os.getpid(), socket.gethostname(), since, " ".join(["probe", *sys.argv[1:]])[:500])

    def to_text(self) -> str:
        return json.dumps({"pid": self.pid, "host": self.host, "since": self.since, "command": self.command}) + "\n"

    def alive(self) -> bool | None:
        """Whether the process still runs (None: it is on another host, so this machine cannot tell)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # it exists, under another user
            return True
        return True

    def describe(self) -> str:
        cmd = f" ({self.command})" if self.command else ""
        return f"pid {self.pid} on host {self.host}{cmd}, since {self.since}"


class RunLock:
    """The exclusive writer lock of one run folder; use as ``with RunLock(folder).hold(): ...``."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self, *, wait: bool = False, log: Callable[[str], None] = print) -> Holder | None:
        """Take the lock; returns the previous holder when it had died without releasing it (a stale lock).

        Without ``wait`` a held lock raises :class:`LockError` naming the
        holder; with ``wait`` this logs who holds it and blocks until it is free.
        """
        if self._fd >= 0:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not self._try(fd):
                holder = Holder.parse(_read(fd))
                if not wait:
                    raise LockError(self._held_message(holder))
                log(f"{self.folder}: waiting for the writer that holds it: {_who(holder)}")
                sys.stdout.flush()  # it blocks next: a log file or a watcher should see the line now
                self._flock(fd, fcntl.LOCK_EX)
            stale = Holder.parse(_read(fd))
            os.ftruncate(fd, 0)
            os.pwrite(fd, Holder.me().to_text().encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)  # closing drops the lock if it was taken
            raise
        self._fd = fd
        if stale is not None:
            log(
                f"{self.folder}: took over a stale lock left by {stale.describe()}: that process ended without "
                "releasing it (killed or crashed); every chunk it committed is verified before it is trusted"
            )
        return stale

    def release(self) -> None:
        """Empty the lock file (a clean exit leaves no holder behind) and drop the lock."""
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # releases the flock
            self._fd = -1

    def hold(self, *, wait: bool = False, log: Callable[[str], None] = print) -> _Held:
        return _Held(self, wait, log)

    def peek(self) -> bool:
        """Whether some process holds the lock now (read-only: a shared lock taken and dropped at once)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def holder(self) -> Holder | None:
        """The holder the lock file names (read-only; it may be a dead process's)."""
        try:
            return Holder.parse(self.path.read_text())
        except FileNotFoundError:
            return None

    def _try(self, fd: int) -> bool:
        try:
            self._flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _flock(self, fd: int, op: int) -> None:
        try:
            fcntl.flock(fd, op)
        except OSError as e:
            if e.errno in _UNSUPPORTED:
                raise LockError(
                    f"cannot lock {self.path}: the file system refuses advisory locks ({e.strerror}); on NFS the "
                    "mount needs locking (not -o nolock), on Lustre the flock mount option. Use an --out on a file "
                    "system with locks (see docs/store.md)"
                ) from None
            raise

    def _held_message(self, holder: Holder | None) -> str:
        hint = ""
        if holder is not None and holder.alive() is False:
            hint = (
                " That pid is not running on this host, so the lock is held elsewhere: by a process in another "
                "container sharing the folder, or by an NFS server that still counts a crashed client's lock "
                "(it expires with the server's lease)."
            )
        return (
            f"another probe process is writing {self.folder}: {_who(holder)}.{hint} Wait for it to finish "
            "(or pass --wait-for-lock to queue behind it), or stop it; a lock whose process has died is taken "
            "over automatically"
        )


@dataclass(frozen=True)
class _Held:
    lock: RunLock
    wait: bool
    log: Callable[[str], None]

    def __enter__(self) -> RunLock:
        self.lock.acquire(wait=self.wait, log=self.log)
        return self.lock

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def _read(fd: int) -> str:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0).decode("utf-8", errors="replace") if size else ""


def _who(holder: Holder | None) -> str:
    return holder.describe() if holder is not None else "a process that has not written its name yet"
