"""Building a site (`build`): its inputs read and checked first, then the site written into a
new folder beside `--out`, which replaces `--out` only once it is whole, so a failure at any
point (a bad input, a full disk, an interrupt) leaves `--out` as it was; `--out` itself must be
new, empty or an earlier site, never a folder of something else."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import time
from pathlib import Path

from eval.site.pages import write_site
from eval.site.pictures import PICTURES, WORST
from eval.site.runs import discover

DEFAULT_OUT = Path("results") / "site"
MARKER = ".finality-site"  # an earlier site in --out, which a build may replace


def _check_out(out: Path) -> None:
    """`out` may be a new folder, an empty one or an earlier site (to be replaced); anything
    else is refused."""
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise ValueError(f"--out {out} is a symbolic link; give the folder itself")
    if not stat.S_ISDIR(mode):
        raise ValueError(f"--out {out} is a file")
    if any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(f"--out {out} is a folder that holds something other than a site "
                         "this command built; give an empty or new folder")


def _stage(out: Path) -> tuple[Path, list[Path]]:
    """A new, empty folder beside `out` to build the site in, and the folders above it that
    were made for it (removed again if the build fails)."""
    made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.parent / f".{out.name}.building-{os.getpid()}-{secrets.token_hex(4)}"
        staging.mkdir()
    except OSError as exc:
        raise ValueError(f"--out {out} cannot be written ({exc.strerror})") from None
    return staging, made


def _replace(staging: Path, out: Path) -> None:
    """The built site at `out`, in place of what was there (an earlier site, an empty folder);
    until the last rename `out` is what it was."""
    _check_out(out)  # again: something may have been put there while the site was built
    old = None
    if os.path.lexists(out):
        old = out.parent / f".{out.name}.replaced-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(out, old)
    try:
        os.rename(staging, out)
    except OSError:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build(dirs: list[Path], out: Path = DEFAULT_OUT, pictures: str = "some", workers: int = 2,
          worst: int = WORST, progress: bool = False, private: bool = False) -> dict:
    """Build the site of every graded run under `dirs` into `out`, the pictures drawn by
    `workers` processes (`worst`: how many of each policy `some` draws); return what was written
    (`folders`, `episodes`, `pictures`, `files`, `bytes`, `seconds`, and `lazy`: the pictures
    not drawn, by path, for `serve` to draw on request). Every input is read and checked before
    anything is written, and the site is built beside `out` and replaces it only once whole: a
    failure leaves `out` as it was."""
    started = time.perf_counter()
    if pictures not in PICTURES:
        raise ValueError(f"--pictures must be one of {', '.join(PICTURES)}, got {pictures!r}")
    if not 1 <= workers <= 64:
        raise ValueError(f"--workers must lie in 1..64, got {workers}")
    folders = discover(dirs)  # everything read and checked before anything is written
    hidden = [f.name for f in folders if f.private]
    if hidden and not private:
        raise ValueError(f"{hidden[0]} is a run of the private split: its site would publish "
                         "the hidden tasks' ids, records and calls; pass --private to build it "
                         "anyway, for the operator's eyes only")
    if out.resolve() in [f.path.resolve() for f in folders] or any(
            out.resolve() in f.path.resolve().parents for f in folders):
        raise ValueError(f"--out {out} would overwrite a results folder it reads")
    _check_out(out)
    staging, made = _stage(out)
    try:
        (staging / MARKER).write_text("built by `python -m eval view`; replaced by the next "
                                      "build\n")
        built = write_site(folders, dirs, staging, pictures, workers, worst, progress)
        _replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:  # the folders made for the staging one, innermost first
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return {**built, "seconds": time.perf_counter() - started}

