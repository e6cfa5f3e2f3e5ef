"""Safe files for the command line tools (``prove``, ``site``): small helpers, one-line errors.

Files
    :func:`write_text` / :func:`write_json` / :func:`write_bytes` replace a file atomically: the data goes to a new
    temporary file in the same folder (created with ``O_EXCL | O_NOFOLLOW``, so never through a link), is fsynced,
    then ``os.replace``-d over the name. A reader sees the old file or the new one, never half of one; a crash or a
    full disk leaves the old file as it was. They refuse (:class:`UnsafePath`) a name that is a symbolic link or
    not a regular file, and, with ``inside=``, one that resolves outside that folder.
    :func:`read_regular` reads a regular file only (not a FIFO, ``/dev/zero`` or a folder), at most ``limit_bytes``.
    :func:`folder_problem` says in one line why a folder cannot be an output folder.

Locks
    :func:`folder_lock` holds an exclusive ``flock`` on ``FOLDER/.lock`` for as long as a command writes there; a
    second command gets :class:`FolderBusy` at once ("another prove is writing to DIR (pid N)").

Child processes and stop signals are :mod:`course_utils.processes`'s.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import stat
from typing import Any, Iterator, Union

__all__ = [
    "UnsafePath",
    "NotRegular",
    "FolderBusy",
    "write_bytes",
    "write_text",
    "write_json",
    "read_regular",
    "folder_problem",
    "folder_lock",
    "make_folder",
]

PathLike = Union[str, "os.PathLike[str]"]


class UnsafePath(ValueError):
    """A file that must not be written: a symbolic link, not a regular file, or outside the folder it belongs in."""


class NotRegular(ValueError):
    """A file that cannot be read as asked: not a regular file, or larger than the limit."""


class FolderBusy(RuntimeError):
    """Another process holds the folder's lock (the message names it and its pid)."""


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------


def _check_target(path: pathlib.Path, inside: PathLike | None) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{path} is a symbolic link; refusing to write through it (remove the link first)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{path} exists and is not a regular file; refusing to replace it")
    if inside is not None:
        root = os.path.realpath(inside)
        where = os.path.join(os.path.realpath(path.parent), path.name)
        if os.path.commonpath([root, where]) != root:
            raise UnsafePath(f"{path} resolves to {where}, outside {inside}; refusing to write it")


def write_bytes(path: PathLike, data: bytes, *, inside: PathLike | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (temporary file in the same folder, fsync, ``os.replace``).

    Raises :class:`UnsafePath` if ``path`` is a symbolic link or not a regular file, or (with ``inside``) resolves
    outside that folder; an ``OSError`` (e.g. ENOSPC, EACCES) leaves the old file untouched and no temporary
    file behind. The new file gets the usual permissions (0666 less the umask)."""
    path = pathlib.Path(path)
    _check_target(path, inside)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for attempt in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as err:  # e.g. EACCES, ENOSPC, EROFS: name the file asked for, not the temporary one
            raise OSError(err.errno, err.strerror, str(path)) from err
    else:  # pragma: no cover - 100 random names taken
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))
    try:
        with open(fd, "wb", closefd=True) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a name: even a link put there since the check is replaced, not followed
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None and err.errno:  # f.write/fsync name no file: say which
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk (not possible everywhere: not worth failing)
        dir_fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_text(path: PathLike, text: str, *, inside: PathLike | None = None, encoding: str = "utf-8") -> None:
    """:func:`write_bytes` for text."""
    write_bytes(path, text.encode(encoding), inside=inside)


def write_json(path: PathLike, obj: Any, *, inside: PathLike | None = None, indent: int | None = 1) -> None:
    """:func:`write_bytes` for JSON (UTF-8, not ASCII-escaped, a final newline)."""
    write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n", inside=inside)


def read_regular(path: PathLike, limit_bytes: int, *, follow_links: bool = True) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit_bytes``; else :class:`NotRegular`
    (a FIFO is not waited on, ``/dev/zero`` is not read forever). ``follow_links=False`` also refuses a link.
    A missing or unreadable file raises the usual ``OSError``."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_links:
            raise NotRegular(f"{path} is a symbolic link; not reading it") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(f"{path} is not a regular file (a folder, a pipe or a device); not reading it")
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as f:
            data = f.read(limit_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > limit_bytes:
        raise NotRegular(f"{path} is larger than {limit_bytes} bytes; not reading it")
    return data


def folder_problem(raw: PathLike) -> str | None:
    """None when ``raw`` names a folder that exists or can be made and where a file can be written; otherwise
    why not, in one line ("--out" style messages: empty, a file, under a file, a FIFO, read-only, disk full)."""
    if not str(raw).strip():
        return "the folder name is empty (give one, e.g. runs/proof, or . for this folder)"
    folder = pathlib.Path(raw).expanduser()
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        st = None
    except OSError as err:  # e.g. a path under a file: ENOTDIR
        return err.strerror or str(err)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return "it exists and is not a folder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes(folder / f".write-test-{os.getpid()}", b"x")
        os.unlink(folder / f".write-test-{os.getpid()}")
    except UnsafePath as err:
        return str(err)
    except OSError as err:
        return err.strerror or str(err)
    return None


# ----------------------------------------------------------------------------------------------
# Locks
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def folder_lock(folder: PathLike, what: str = "prove") -> Iterator[None]:
    """Hold an exclusive, non-blocking ``flock`` on ``folder/.lock`` (which records this process's pid) while
    the block runs. Raises :class:`FolderBusy` ("another <what> is writing to <folder> (pid N)") if another
    process holds it, :class:`UnsafePath` if ``.lock`` is a link. The lock ends with the process however it
    ends (the kernel drops it); the file stays (deleting it would let two processes lock two different files).
    Where ``fcntl`` does not exist (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path = os.path.join(os.fspath(folder), ".lock")
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symbolic link; refusing to use it as a lock (remove it)") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"{path} is not a regular file; refusing to use it as a lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise FolderBusy(
                f"another {what} is writing to {folder}{pid}; wait for it to end, or use another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


# ----------------------------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------
# Folders (added for ``site``: its scratch folders inside --out)
# ----------------------------------------------------------------------------------------------


def make_folder(path: PathLike, *, inside: PathLike, fresh: bool = False) -> pathlib.Path:
    """Make ``path`` (and its missing parents) below the folder ``inside``, which must exist; every part of it
    from ``inside`` down must be a real folder, not a symbolic link (:class:`UnsafePath` otherwise), so nothing
    made or deleted there lands elsewhere. ``fresh=True`` first removes what ``path`` holds (a link or file there
    is unlinked, never followed; a folder is removed with :func:`shutil.rmtree`, which does not follow the links
    inside it). Returns ``path``."""
    import shutil

    path, top = pathlib.Path(path), pathlib.Path(inside)
    try:
        parts = path.relative_to(top).parts
    except ValueError:
        raise UnsafePath(f"{path} is not inside {top}; refusing to make it") from None
    if not parts or ".." in parts:
        raise UnsafePath(f"{path} is not a folder below {top}; refusing to make it")
    here = top
    for n, part in enumerate(parts, 1):
        here = here / part
        if fresh and n == len(parts):
            try:
                st = os.lstat(here)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                shutil.rmtree(here)
            elif st is not None:
                os.unlink(here)
        try:
            os.mkdir(here)
        except FileExistsError:
            pass
        st = os.lstat(here)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(f"{here} is a symbolic link; refusing to write through it (remove the link first)")
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(f"{here} exists and is not a folder")
    return path
