"""The output folder's lock: ``OUTDIR/.medproc.lock`` (``fcntl.lockf``; the kernel releases it
when the process dies, even by ``kill -9``), held by one run at a time and never written
through a link; :func:`lock_holder` tests it without taking it (``--dry-run``)."""

from __future__ import annotations

import errno
import os
import stat
import warnings

from .errors import MedprocWarning, OutputError

__all__ = ["OutdirLock", "lock_holder"]


#: (st_dev, st_ino) of the lock files this process holds: testing one of them would release it
#: (closing any descriptor of a file drops the process's POSIX locks on it)
_HELD: set[tuple[int, int]] = set()


class OutdirLock:
    """An exclusive lock on ``OUTDIR/.medproc.lock`` held by this process until :meth:`release`
    (or its death). ``created``: this run made the folder (released with nothing else in it,
    e.g. after a usage error found once the cases were known, it is removed again).

    The lock file is never opened through a link (``O_NOFOLLOW``) nor written when another
    name leads to it: a symbolic link, a hard link or any other non-file named
    ``.medproc.lock`` is replaced by a lock file of its own (the file it led to is untouched;
    a hard-linked lock that another run holds is refused as a held lock), a folder is an
    :class:`~medproc.errors.OutputError`."""

    def __init__(self, outdir: str, created: bool = False, name: str = ".medproc.lock",
                 busy: str = "is writing into this folder; wait for it to finish, or choose "
                 "another -o"):  # fmt: skip
        self.outdir, self.created, self.name, self.busy = outdir, created, name, busy
        self.path = os.path.join(outdir, name)
        for _ in range(8):  # (another run replacing a link at the same moment: once more)
            fd = self._open()
            if fd is not None:
                break
        else:
            raise OutputError(
                f"its lock file {name} keeps changing under this run; is another program "
                "writing into this folder? Choose another -o",
                outdir,
            )
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as e:
            os.close(fd)
            raise OutputError(f"cannot write its lock file: {e.strerror}", outdir) from None
        self._f = os.fdopen(fd, "r+")
        _HELD.add(self._id())

    def _id(self) -> tuple[int, int]:
        st = os.fstat(self._f.fileno())
        return st.st_dev, st.st_ino

    def _open(self) -> int | None:
        """The lock file opened and locked (an fd), or None when it changed meanwhile."""
        import fcntl

        self._replace_odd()
        if _held(self.path):  # (before opening it: closing any descriptor would release it)
            raise OutputError(f"this process (pid {os.getpid()}) {self.busy}", self.outdir)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                return None  # (replaced meanwhile by a link or another kind of file)
            if e.errno == errno.ENOENT:  # (the run before removed the folder it had made)
                os.makedirs(self.outdir, exist_ok=True)
                return None
            raise OutputError(f"cannot create its lock file: {e.strerror}", self.outdir) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                return None
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                raise OutputError(
                    f"another medproc convert (pid {holder}) {self.busy}", self.outdir
                ) from None
            now = os.lstat(self.path)
        except FileNotFoundError:  # (removed meanwhile)
            os.close(fd)
            return None
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or os.fstat(fd).st_nlink != 1:
            os.close(fd)  # another name leads to it (a hard link): replace ours, write none
            if now.st_nlink != 1 and stat.S_ISREG(now.st_mode):
                self._unlink("a hard link to another file")
            return None
        return fd

    def _replace_odd(self) -> None:
        """Remove a lock file that is not a regular file (a symbolic link, a FIFO, a
        socket...: its name only); a folder is an error."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise OutputError(f"cannot look at its lock file: {e.strerror}", self.outdir) from None
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(
                f"{self.name}, where medproc keeps its lock, is a folder: remove it, or choose "
                "another -o",
                self.outdir,
            )
        if not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            self._unlink(what)

    def _unlink(self, what: str) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise OutputError(
                f"{self.name} is {what}, not medproc's lock file, and cannot be replaced "
                f"({e.strerror}): remove it, or choose another -o",
                self.outdir,
            ) from None
        warnings.warn(
            f"{self.path} was {what}, not medproc's lock file: replaced by one (what it led to "
            "is untouched)",
            MedprocWarning,
            stacklevel=4,
        )

    def release(self) -> None:
        """Remove the lock file, then unlock (closing the file releases the lock): a run never
        leaves it behind, also one refused after it locked the folder. A run that opened the
        file just before the unlink and locks it just after the close holds a file no name
        leads to: :meth:`_open` checks after locking that the name still leads to the file it
        locked, and starts again when not. A folder this run made and left empty goes too (a
        run that finds it gone makes it again)."""
        if self._f.closed:
            return
        _HELD.discard(self._id())
        try:
            if os.path.samestat(os.lstat(self.path), os.fstat(self._f.fileno())):
                os.unlink(self.path)
            if self.created and not os.listdir(self.outdir):
                os.rmdir(self.outdir)
        except OSError:
            pass
        finally:
            self._f.close()


def lock_holder(outdir: str) -> str | None:
    """The pid (as its lock file says it) of the run holding ``OUTDIR``'s lock now, else None;
    the lock is tested, never taken, and nothing is written."""
    import fcntl

    path = os.path.join(os.fspath(outdir), ".medproc.lock")
    if _held(path):
        return str(os.getpid())
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # none, a link or no access: the run would say so, or take it over
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        return None
    finally:
        os.close(fd)  # (and with it the shared lock just taken)


def _held(path: str) -> bool:
    """Whether ``path`` (not followed) is a lock file this process holds."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in _HELD
