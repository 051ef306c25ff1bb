"""A DIR of `eval view`'s command line, walked and read following no link (`Tree`).

A site publishes what it reads: a link under a results folder (to ~/.ssh, to another run) must
not be read as the run's own file, nor a fifo stall the build, so such an entry is refused,
naming it, rather than followed or skipped (docs/results.md, "The results site").
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a fifo"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISREG, "a regular file"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refused(path: Path, mode: int, wanted: str = "a regular file or folder") -> ValueError:
    return ValueError(f"{path} is {_kind(mode)}, not {wanted}: `eval view` reads only regular "
                      "files and folders under each DIR and follows no link (a link would "
                      "publish whatever it points to); remove it, or copy what it points to in")


@dataclass(frozen=True)
class Listing:
    """One folder under a DIR: its regular files and its subfolders, by name."""

    files: set
    dirs: set
    ident: tuple  # (st_dev, st_ino): the same run reached from two DIRs is shown once


class Tree:
    """One DIR of the command line, walked and read through file descriptors: every folder is
    opened with `O_NOFOLLOW | O_DIRECTORY` relative to its parent's descriptor, every file with
    `O_NOFOLLOW` after an `lstat` that says it is regular (and an `fstat` that says it is still
    the same file), so no component of any path below DIR can be a link, and nothing but a
    regular file is ever opened. DIR itself must not be a link either; the folders above it are
    the operator's own path, taken as they are."""

    def __init__(self, top: Path):
        self.top = top
        try:
            self.fd = os.open(top, _DIR)
        except OSError:
            try:
                mode = os.lstat(top).st_mode
            except OSError:
                raise ValueError(f"{top} is not a folder") from None
            raise (ValueError(f"{top} is not a folder") if stat.S_ISREG(mode) else
                   _refused(top, mode, "a folder")) from None
        self.listing: dict[tuple[str, ...], Listing] = {}

    def close(self) -> None:
        os.close(self.fd)

    def path(self, rel: tuple[str, ...]) -> Path:
        return self.top.joinpath(*rel)

    def _why(self, dir_fd: int, name: str, rel: tuple[str, ...], exc: OSError,
             wanted: str) -> ValueError:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return ValueError(f"{self.path(rel)} cannot be read ({exc.strerror})")
        return _refused(self.path(rel), mode, wanted)

    def _open_dir(self, dir_fd: int, name: str, rel: tuple[str, ...]) -> int:
        try:
            return os.open(name, _DIR, dir_fd=dir_fd)
        except OSError as exc:
            raise self._why(dir_fd, name, rel, exc, "a folder") from None

    def walk(self) -> dict[tuple[str, ...], Listing]:
        """Every folder under DIR (by its parts), with its files and subfolders; a link or any
        other entry that is neither a regular file nor a folder is refused, naming it."""
        def visit(fd: int, rel: tuple[str, ...]) -> None:
            files, dirs = set(), set()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            dirs.add(entry.name)
                        elif entry.is_file(follow_symlinks=False):
                            files.add(entry.name)
                        else:
                            raise _refused(self.path(rel + (entry.name,)),
                                           entry.stat(follow_symlinks=False).st_mode)
            except OSError as exc:
                raise ValueError(f"{self.path(rel)} cannot be listed ({exc.strerror})") from None
            st = os.fstat(fd)
            self.listing[rel] = Listing(files, dirs, (st.st_dev, st.st_ino))
            for name in sorted(dirs):
                child = self._open_dir(fd, name, rel + (name,))
                try:
                    visit(child, rel + (name,))
                finally:
                    os.close(child)

        visit(self.fd, ())
        return self.listing

    def read(self, rel: tuple[str, ...]) -> bytes:
        """The bytes of the regular file at `rel` (parts below DIR), no link followed."""
        opened: list[int] = []
        try:
            fd = self.fd
            for i, name in enumerate(rel[:-1]):
                fd = self._open_dir(fd, name, rel[:i + 1])
                opened.append(fd)
            name = rel[-1]
            try:
                before = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(before.st_mode):
                    raise _refused(self.path(rel), before.st_mode, "a regular file")
                handle = os.open(name, _FILE, dir_fd=fd)
            except OSError as exc:
                raise self._why(fd, name, rel, exc, "a regular file") from None
            with open(handle, "rb") as file:
                now = os.fstat(file.fileno())
                if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (
                        before.st_dev, before.st_ino):
                    raise ValueError(f"{self.path(rel)} was replaced while it was read")
                return file.read()
        finally:
            for fd in opened:
                os.close(fd)
