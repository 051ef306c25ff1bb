"""The private split's master seed: made by `python -m eval keygen --out FILE` (128 random bits
in a new file of mode 0600) and read by the commands that grade on `--split private`, from one of
three sources (a file, the environment, the command line), never two. Nothing here prints or
writes the seed: only the split's fingerprint ever leaves the process."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from finality_gym.corpus import check_master_seed, new_master_seed

MASTER_SEED_FILE_MAX = 1024  # bytes: a seed is at most 78 digits; more is not a seed file


def master_seed(args: argparse.Namespace) -> int | None:
    """The private split's master seed from one of its three sources, never two, checked by
    `check_master_seed` (2**127 <= seed < 2**256: `python -m eval keygen --out FILE` makes
    one). No error shows the seed."""
    given = {"--master-seed": args.master_seed, "--master-seed-file": args.master_seed_file,
             "FINALITY_MASTER_SEED": os.environ.get("FINALITY_MASTER_SEED")}
    given = {k: v for k, v in given.items() if v is not None}
    if len(given) > 1:
        raise ValueError(f"give the master seed once, not by {' and '.join(given)}")
    if not given:
        return None
    source, value = given.popitem()
    if source == "--master-seed" and getattr(args, "backend", "local") == "ray":
        # Ray keeps the driver's command line in the cluster's job table (`ray list jobs`, the
        # dashboard): anyone who can connect to the cluster would read the seed there
        raise ValueError("--master-seed with --backend ray would put the seed in the Ray "
                         "cluster's job table, which the cluster's users can read: give "
                         "--master-seed-file (or FINALITY_MASTER_SEED)")
    if source == "--master-seed-file":
        try:
            with open(value, "rb") as f:
                data = f.read(MASTER_SEED_FILE_MAX + 1)
        except OSError as exc:
            raise ValueError(f"--master-seed-file {value}: {exc.strerror}") from None
        if len(data) > MASTER_SEED_FILE_MAX:
            raise ValueError(f"--master-seed-file {value}: over {MASTER_SEED_FILE_MAX} bytes, "
                             "not a master seed (one decimal integer)")
        value = data.decode("ascii", errors="replace").strip()
    try:
        seed = int(value)
    except ValueError:
        raise ValueError(f"{source}: the master seed must be an integer") from None
    try:
        return check_master_seed(seed)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def keygen(path: Path) -> None:
    """Write a new master seed (`new_master_seed`: 128 random bits) to `path`, a file made
    here with mode 0600 and never one that exists; print where, never the seed."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        raise ValueError(f"keygen: {path} exists; keygen never overwrites a master seed "
                         "(move it away, or give another --out)") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{new_master_seed()}\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    print(f"keygen: wrote a master seed (128 random bits) to {path} (mode 0600); keep it "
          f"secret, and grade with: python -m eval headline --split private "
          f"--master-seed-file {path}")


def seed_options(parser: argparse.ArgumentParser) -> None:
    """`--master-seed-file` and `--master-seed` (or FINALITY_MASTER_SEED), read by `master_seed`."""
    parser.add_argument("--master-seed-file", type=Path, default=None,
                        help="a file holding the private split's master seed (or set "
                             "FINALITY_MASTER_SEED), at least 2**127 and below 2**256: make one "
                             "with `python -m eval keygen --out FILE`; only its fingerprint is "
                             "printed and written, never the seed")
    parser.add_argument("--master-seed", type=int, default=None,
                        help="the master seed on the command line: WARNING, every process of the "
                             "machine can read a command line (refused with --backend ray: the "
                             "cluster's job table keeps it); prefer --master-seed-file")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True,
                        help="the file to create (never overwritten); give it to `headline "
                             "--split private --master-seed-file`")


def main(args: argparse.Namespace) -> int:
    keygen(args.out)
    return 0
