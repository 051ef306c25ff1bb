"""The run folder: the one module that writes and reads every results and training folder.

A folder is written by one process at a time (`lock`: `DIR/.lock`, held with flock, says which
process holds it), pinned to one configuration (`pin`: `DIR/run.json` and the content hashes of
what the run loads), and its rows are sealed JSON lines (`seal`, `read_rows`). The rules every
caller shares:

- Readers never change a file: a torn last line (a killed writer) is left out of what
  `read_rows` returns; only a writer that holds the lock cuts it off (`repair`) before it
  appends.
- Rows are appended in job order whatever order they complete in (`OrderedAppender`), so a
  parallel run writes the same file as a serial one; a file whose rows a resume left out of job
  order is rewritten in order once its run is complete (`keep_in_order`).
- Whole files are replaced atomically (`write_atomic`, `save_atomic`): a killed process leaves the
  old file or the new one, never half of one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from json.encoder import JSONEncoder, c_make_encoder, encode_basestring_ascii
from typing import Callable, Iterable

ROWS = "episodes.jsonl"
MANIFEST = "run.json"
SUMMARY = "summary.json"  # the statistics of a graded run (or of a sweep), written last
TRANSCRIPTS = "transcripts"  # a model arm's folder of conversations, one file an episode


def transcript_name(task_id: str, seed: int) -> str:
    """The file under `TRANSCRIPTS/` that holds one episode's requests and responses."""
    return f"{task_id}__seed{seed}.jsonl"


def prepare(out: Path) -> None:
    """A usable folder, or a one-line error that names it (and changes nothing)."""
    for parent in [out, *out.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"--out {out}: {parent} is a file, not a folder")
            break
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out} cannot be created: {exc.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} is not writable")


@contextmanager
def lock(out: Path):
    """Hold `out/.lock` while writing `out`: a second writer on the same folder (another run, a
    killed sweep's orphaned worker) is refused at once, by process id, instead of both
    appending."""
    path = out / ".lock"
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise ValueError(f"{out} is being written by another run (process {holder}); wait for "
                         "it to finish or use another --out folder") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def write_atomic(path: Path, text: str) -> None:
    """A text file that a killed process leaves whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def save_atomic(path: Path, save: Callable[[Path], None]) -> None:
    """A file written by someone else's `save(path)` (a model archive), whole or not at all; the
    partial file keeps the suffix, which some savers add when it is missing."""
    partial = path.with_name(f"{path.stem}.partial{path.suffix}")
    save(partial)
    os.replace(partial, path)


def pin(out: Path, wanted: dict, inputs: dict | None = None) -> None:
    """Pin `wanted` in `out/run.json`, or refuse a folder that holds a run of another one.
    `inputs` maps a policy's identity to the hash of what it loads: one seen before with other
    content is refused (its rows were graded from something else); new ones are added."""
    path = out / MANIFEST
    found_inputs: dict = {}
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is corrupt ({exc})") from None
        if not isinstance(found, dict):
            raise ValueError(f"{path} is corrupt (not a JSON object)")
        found_inputs = found.pop("inputs", {})
        if found != wanted:
            diff = sorted(k for k in wanted.keys() | found.keys() if found.get(k) != wanted.get(k))
            raise ValueError(f"{out} holds a run with a different configuration ({', '.join(diff)}"
                             "); use another --out folder")
        for name, digest in (inputs or {}).items():
            if name in found_inputs and found_inputs[name] != digest:
                raise ValueError(f"{name} has changed since its rows in {out} were graded (sha256 "
                                 f"{found_inputs[name][:12]} then, {digest[:12]} now); grade it "
                                 "into another --out folder")
    merged = {**found_inputs, **(inputs or {})}
    if not path.exists() or merged != found_inputs:
        write_atomic(path, json.dumps({**wanted, "inputs": merged} if merged else wanted,
                                      indent=2) + "\n")


# ------------------------------------------------------------------------------------ rows
def _compact(sort_keys: bool) -> Callable[[object], str]:
    """`json.dumps(o, separators=(",", ":"), sort_keys=sort_keys)`, its C encoder made once:
    `json.dumps` builds an encoder at every call, which was a third of the cost of sealing a
    row (two encodings a row, one sorted). The text is the same (ASCII, NaN allowed), but a
    circular structure, which no row is, recurses instead of raising ValueError."""
    if c_make_encoder is None:  # an interpreter without the C accelerator
        return lambda o: json.dumps(o, separators=(",", ":"), sort_keys=sort_keys)
    encode = c_make_encoder(None, JSONEncoder().default, encode_basestring_ascii, None, ":",
                            ",", sort_keys, False, True)
    return lambda o: "".join(encode(o, 0))


_LINE = _compact(sort_keys=False)
_CANONICAL = _compact(sort_keys=True)


def _digest(row: dict) -> str:
    return hashlib.sha256(_CANONICAL(row).encode()).hexdigest()[:16]


def seal(row: dict) -> str:
    """A row as its JSONL line, with `check`: the first 16 hex digits of the SHA-256 of the
    row's canonical JSON. It catches a row edited by hand or written by something else; it is a
    checksum, not a signature (the code that computes it is public)."""
    line = _LINE(row)  # `{...}`, and the check added as its last key:
    return f'{line[:-1]},"check":"{_digest(row)}"}}'  # the JSON of {**row, "check": ...}


_ROW_TYPES = {"policy": str, "task_id": str, "seed": int, "gap": int, "position": int}


def _verified(row, path: Path, number: int) -> dict:
    if not isinstance(row, dict) or not isinstance(row.get("check"), str):
        raise ValueError(f"{path}:{number} is not a graded episode (no checksum): the file was "
                         "edited or is not this grader's; move it away to start afresh")
    check = row.pop("check")
    if _digest(row) != check or not all(isinstance(row.get(k), t)
                                         for k, t in _ROW_TYPES.items()):
        raise ValueError(f"{path}:{number} fails its checksum: the row was edited; move the "
                         "file away to start afresh")
    return row


def _complete(path: Path) -> tuple[bytes, int]:
    """The file's bytes and where its last complete line ends."""
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    data = path.read_bytes()
    return data, data.rfind(b"\n") + 1


def read_rows(path: Path) -> list[dict]:
    """The complete, verified rows of an episodes file, without changing it: a torn last line
    (a killed writer's) is left out. A line that is not JSON, or a row that fails its checksum,
    is a clear error."""
    if not path.exists():
        return []
    data, end = _complete(path)
    return rows_of(data[:end], path)


def json_lines(data: bytes) -> list[bytes]:
    """The complete lines of a JSON-lines file's bytes, split on newlines alone (a JSON text
    may hold a raw U+2028, U+2029 or U+0085, which `str.splitlines` splits on, and a carriage
    return as whitespace, which `bytes.splitlines` splits on); a torn last line (no newline
    after it) is left out."""
    return data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]


def rows_of(data: bytes, path: Path) -> list[dict]:
    """The verified rows of an episodes file's bytes, read by the caller (the results site reads
    them without following a link), `path` named in errors; a torn last line is left out."""
    rows = []
    for number, line in enumerate(json_lines(data), 1):
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}:{number} is not a JSON record ({exc}); the file is "
                             "corrupt: move it away to start the run afresh") from None
        rows.append(_verified(row, path, number))
    return rows


def repair(path: Path) -> None:
    """Cut a torn last line off, so that the next append starts a line; only a writer holding
    the folder's lock calls this."""
    if path.exists():
        data, end = _complete(path)
        if end < len(data):
            with open(path, "r+b") as f:
                f.truncate(end)


def key(row: dict) -> tuple[str, str, int]:
    return row["policy"], row["task_id"], row["seed"]


def keep_in_order(path: Path, keys: list[tuple], jobs: list) -> bool:
    """Rewrite the file (atomically) if the rows of `jobs` are not in job order, as after a
    resume that completed an episode an earlier run had skipped, so that a complete run's file
    is the same however it got there; rows of other runs in the folder keep their place in
    front. `keys` are the file's rows' keys (`key`), in its order. Returns whether it rewrote
    the file."""
    rank = {job: i for i, job in enumerate(jobs)}
    ours = [i for i in map(rank.get, keys) if i is not None]
    if ours != sorted(ours):
        whole = read_rows(path)  # `rows` may be `grade`'s, without their calls
        others = [r for r in whole if key(r) not in rank]
        ordered = sorted((r for r in whole if key(r) in rank), key=lambda r: rank[key(r)])
        write_atomic(path, "".join(seal(r) + "\n" for r in others + ordered))
        return True
    return False


class OrderedAppender:
    """Appends lines in job order as jobs complete in any order; a job that ends with no line
    (an episode the infrastructure could not grade) is passed over. Each line is flushed as it
    is written, so a killed run loses only the jobs still in flight."""

    def __init__(self, path: Path):
        self.file = open(path, "a")
        self.ready: dict[int, str | None] = {}
        self.next = 0

    def extend(self, start: int, lines: Iterable[str | None]) -> list[str]:
        """Consecutive jobs' lines from `start` on (a chunk of work), written and flushed
        together; returns the lines written now."""
        for offset, line in enumerate(lines):
            self.ready[start + offset] = line
        written = []
        while self.next in self.ready:
            line = self.ready.pop(self.next)
            if line is not None:
                written.append(line)
            self.next += 1
        if written:
            self.file.write("".join(line + "\n" for line in written))
            self.file.flush()
        return written

    def close(self) -> None:
        self.file.close()


# The rows of the rows file that `grade` last held, without calls, by the SHA-256 of the file's
# bytes (the rows are a function of them): `python -m eval all` grades the headline's folder
# three times (the headline, then the cost sweep and the ablation's baseline reuse it), and
# parsing and checking its 14,445 rows again cost a second each time, against a hundredth for
# reading and hashing the file. One entry: the next run replaces it.
_ROWS_READ_LAST: dict[bytes, list[dict]] = {}


def _digest_of(path: Path) -> bytes | None:
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except FileNotFoundError:
        return None


def rows_read_last(path: Path) -> list[dict] | None:
    """The rows `remember_rows` kept for the file as it is now (copies), else None."""
    rows = _ROWS_READ_LAST.get(_digest_of(path)) if _ROWS_READ_LAST else None
    return None if rows is None else [row.copy() for row in rows]


def remember_rows(path: Path, rows: list[dict]) -> None:
    _ROWS_READ_LAST.clear()
    digest = _digest_of(path)
    if digest is not None:
        _ROWS_READ_LAST[digest] = [row.copy() for row in rows]


def forget_rows() -> None:
    _ROWS_READ_LAST.clear()
