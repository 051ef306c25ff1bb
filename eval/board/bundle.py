"""The submission bundle: one file that holds a leaderboard entry, the one module that writes and
reads it.

A bundle is a zip archive (stored, not compressed) of

- `manifest.json`: `format` (`BUNDLE_FORMAT`), `name`, `kind` (`KINDS`), `spec` (the policy
  spec, its paths relative to the bundle's `policy/` folder), `model` (a model entry's request
  settings: `MODEL_FIELDS`, never an endpoint or a key), `claimed` (the author's own figures on
  the public split, optional: `CLAIM_FIELDS`), `probe` (the probe arm the entry is graded on,
  `submit --probe`; a bundle without it is `full`, as every bundle was before it) and `files`
  (the SHA-256 of every file under `policy/`);
- `policy/...`: the policy's files (an outside policy's file or whole top-level package, a
  saved model and the observation normalization beside it, an ONNX graph; none for the
  project's own policies and for a model entry).

`read_bundle` trusts nothing in the file: the archive may hold only `manifest.json` and the
files the manifest hashes, each a regular file under a plain relative name, stored (as `pack`
writes it: a compressed member could inflate far beyond the bundle's own size, as four of
250 KB did to 250 MiB each) and read to no more than its stored size, within `MAX_BYTES` in
all, its zip directory within `agents.learned.sb3_archive.ZIP_DIRECTORY`; every hash must match; the
manifest may hold only the fields above, so a bundle cannot ask for an unsafe form of grading
(`trust_pickles`, `sandbox`), and its spec must be of its kind and load only files it holds. A
bundle's identity is the SHA-256 of its bytes (`Bundle.sha256`), which a verified entry records.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import math
import os
import stat
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from agents import PolicySpec
from agents.learned.sb3_archive import member, opened
from agents.spec import LEARNED, ONNX
from finality_gym.episode import PROBE_ARMS

BUNDLE_FORMAT = "finality-bundle/1"
MANIFEST = "manifest.json"
POLICY = "policy"  # the folder of the policy's files in the archive, and on extraction
MAX_BYTES = 256 << 20  # the files of a bundle, in all: a policy network is a few MB
MAX_FILES = 2000
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
# kind -> the policy spec kinds it takes (`agents/spec.py`)
KINDS = {"scripted": ("scripted", "plan"), "outside": ("outside",), "sb3": LEARNED,
         "onnx": ONNX, "model": ("model",)}
# A model entry: what decides its rows (the model arm's `ModelConfig`, less the endpoint, the key
# and the retry schedule), and the prices its cost per episode is counted at.
MODEL_FIELDS = {"temperature": (int, float), "max_tokens": int,
                "max_total_tokens": (int, type(None)),
                "params": list, "no_params": list, "price_in": (int, float, type(None)),
                "price_out": (int, float, type(None))}
CLAIM_FIELDS = {"mean_gap": (int, float), "exact": (int, float)}
UNSAFE = {"trust_pickles": "an unpickling loader (the model's pickles would run in the grader, "
                           "which holds the private split's master seed)",
          "sandbox": "grading outside the sandbox (the policy could read the grader's memory)"}
PROJECT = ("agents", "finality_gym", "eval", "train")  # top-level names a bundle may not use
COMPILED = (".pyc", ".pyo", ".so", ".pyd", ".dll", ".dylib")
FIELDS = ("format", "name", "kind", "spec", "model", "claimed", "probe", "files")
DEFAULT_PROBE = "full"  # the arm of a bundle whose manifest names none


class BundleError(ValueError):
    """A bundle refused, with the reason; nothing was written."""


@dataclass(frozen=True)
class Bundle:
    """A bundle read and checked: its manifest, its files (name under `policy/` -> bytes) and
    the SHA-256 of the whole file."""

    manifest: dict
    files: dict
    sha256: str

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def spec(self) -> str:
        return self.manifest["spec"]

    @property
    def probe(self) -> str:
        """The probe arm the entry is graded on."""
        return self.manifest.get("probe", DEFAULT_PROBE)

    def extract(self, folder: Path) -> None:
        """The policy's files into `folder` (new or empty), under the names the manifest
        checked; the spec's paths are relative to it."""
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            raise BundleError(f"{folder} is not empty")
        for name, data in self.files.items():
            path = folder.joinpath(*name.split("/"))
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "xb") as f:
                f.write(data)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(manifest: dict, files: dict) -> bytes:
    """A bundle's bytes from a manifest without `format` and `files` and the policy's files
    (name under `policy/` -> bytes); the same inputs give the same bytes."""
    whole = {"format": BUNDLE_FORMAT, **manifest,
             "files": {name: _digest(data) for name, data in sorted(files.items())}}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in [(MANIFEST, (json.dumps(whole, indent=2, sort_keys=True) + "\n")
                            .encode()), *[(f"{POLICY}/{n}", files[n]) for n in sorted(files)]]:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def write_new(out: Path, data: bytes) -> None:
    """`data` into a new file `out`, never over one."""
    try:
        with open(out, "xb") as f:
            f.write(data)
    except FileExistsError:
        raise BundleError(f"--out {out} exists; a bundle is never overwritten") from None
    except OSError as exc:
        raise BundleError(f"--out {out}: {exc.strerror}") from None


def read_bundle(path: Path) -> Bundle:
    """The bundle at `path`, checked whole (see the module's docstring), or a `BundleError`."""
    try:
        with open(path, "rb") as f:  # no more than the file holds: read(n) reserves n bytes
            data = f.read(min(os.fstat(f.fileno()).st_size, MAX_BYTES + (1 << 20)) + 1)
    except OSError as exc:
        raise BundleError(f"bundle {path}: {exc.strerror}") from None
    return bundle_of(data, str(path))


def bundle_of(data: bytes, where: str) -> Bundle:
    if len(data) > MAX_BYTES + (1 << 20):
        raise BundleError(f"bundle {where}: over {MAX_BYTES >> 20} MiB")
    try:
        archive = opened(io.BytesIO(data), f"bundle {where}")
    except ValueError as exc:  # not a zip, or a directory over its limit
        raise BundleError(str(exc)) from None
    try:
        entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as exc:
        raise BundleError(f"bundle {where}: not a bundle (not a zip archive: {exc})") from None
    names = [e.filename for e in entries]
    if len(entries) > MAX_FILES + 1 or len(set(names)) != len(names):
        raise BundleError(f"bundle {where}: {len(entries)} entries, or one twice")
    if sum(e.file_size for e in entries) > MAX_BYTES:
        raise BundleError(f"bundle {where}: its files unpack to over {MAX_BYTES >> 20} MiB")
    for entry in entries:
        mode = entry.external_attr >> 16
        if entry.is_dir() or stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: no type said
            raise BundleError(f"bundle {where}: {entry.filename!r} is not a regular file (a "
                              "link, a folder entry, a device): refused")
        if entry.compress_type != zipfile.ZIP_STORED:
            raise BundleError(f"bundle {where}: {entry.filename!r} is compressed: a bundle's "
                              "members are stored (as `submit` writes them), so that it holds "
                              "no more than its own bytes")
    if MANIFEST not in names:
        raise BundleError(f"bundle {where}: no {MANIFEST}")
    try:
        manifest = json.loads(_member(archive, MANIFEST, where), parse_constant=_no_constant)
        files = {n[len(POLICY) + 1:]: _member(archive, n, where) for n in names if n != MANIFEST
                 and n.startswith(POLICY + "/")}
    except (ValueError, zipfile.BadZipFile, RuntimeError) as exc:
        raise BundleError(f"bundle {where}: unreadable ({exc})") from None
    if len(files) != len(names) - 1:
        raise BundleError(f"bundle {where}: holds files outside {POLICY}/: "
                          f"{sorted(set(names) - {MANIFEST} - {POLICY + '/' + n for n in files})}")
    _check_manifest(manifest, files, where)
    return Bundle(manifest, files, _digest(data))


def _member(archive: zipfile.ZipFile, name: str, where: str) -> bytes:
    return member(archive, name, MAX_BYTES, f"bundle {where}", "MAX_BYTES")


def _check_manifest(manifest: object, files: dict, where: str) -> None:
    if not isinstance(manifest, dict):
        raise BundleError(f"bundle {where}: {MANIFEST} is not an object")
    for field, why in UNSAFE.items():
        if field in manifest:
            raise BundleError(f"bundle {where} is unsafe: its manifest asks for {field!r}, "
                              f"{why}; a bundle is graded only in the safe form")
    unknown = sorted(set(manifest) - set(FIELDS))
    if unknown:
        raise BundleError(f"bundle {where}: unknown manifest field(s) {unknown}")
    if manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"bundle {where}: format {manifest.get('format')!r}, expected "
                          f"{BUNDLE_FORMAT!r}")
    name, kind, spec = manifest.get("name"), manifest.get("kind"), manifest.get("spec")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BundleError(f"bundle {where}: name {name!r} must match {NAME.pattern}")
    if kind not in KINDS:
        raise BundleError(f"bundle {where}: kind {kind!r}; valid: {', '.join(KINDS)}")
    if "probe" in manifest and manifest["probe"] not in PROBE_ARMS:
        raise BundleError(f"bundle {where}: probe {manifest['probe']!r}; valid: "
                          f"{', '.join(PROBE_ARMS)}")
    hashes = manifest.get("files")
    if not isinstance(hashes, dict):
        raise BundleError(f"bundle {where}: `files` must map each file to its SHA-256")
    if set(hashes) != set(files):
        raise BundleError(f"bundle {where} was tampered with: the manifest hashes "
                          f"{sorted(hashes)} but the archive holds {sorted(files)}")
    folders = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    for file, data in files.items():
        if not all(_PART.fullmatch(p) for p in file.split("/")) or file in folders:
            raise BundleError(f"bundle {where}: {file!r} is not a plain relative name of a "
                              "file (or a folder of another file has its name)")
        if hashes[file] != _digest(data):
            raise BundleError(f"bundle {where} was tampered with: {POLICY}/{file} does not "
                              "match its hash in the manifest")
    _check_spec(spec, kind, files, where)
    _check_fields(manifest.get("model"), MODEL_FIELDS, kind == "model", "model", where)
    _check_fields(manifest.get("claimed"), CLAIM_FIELDS, None, "claimed", where)


def _check_spec(spec: object, kind: str, files: dict, where: str) -> None:
    """The spec is of the bundle's kind and the bundle holds exactly the files it loads: an
    `sb3` model (and the `vecnormalize.pkl` beside it), an `onnx` graph, an outside policy's
    file or its top-level package (no compiled code: a `.pyc` would run instead of the source
    hashed; no name the grader's interpreter already knows, which would stand in for it)."""
    try:
        parsed = PolicySpec.parse(spec) if isinstance(spec, str) else None
    except ValueError as exc:
        raise BundleError(f"bundle {where}: spec: {exc}") from None
    if parsed is None or parsed.kind not in KINDS[kind]:
        raise BundleError(f"bundle {where}: spec {spec!r} is not of kind {kind}")
    if kind in ("sb3", "onnx") or (kind == "outside" and parsed.target.endswith(".py")):
        wanted = {parsed.target} | ({"vecnormalize.pkl"} & set(files) if kind == "sb3" else set())
        if set(files) != wanted or "/" in parsed.target:
            raise BundleError(f"bundle {where}: a {kind} bundle holds exactly the file its spec "
                              f"{spec} loads (an sb3 model also its vecnormalize.pkl), not "
                              f"{sorted(files)}")
        return
    if kind != "outside":
        if files:
            raise BundleError(f"bundle {where}: a {kind} entry holds no files")
        return
    top = parsed.target.split(".")[0]
    if not files or any(f.split("/")[0] not in (top, top + ".py") for f in files):
        raise BundleError(f"bundle {where}: spec {spec} loads the package {top!r}, and the "
                          f"bundle must hold it and nothing else, not {sorted(files)}")
    if top in PROJECT or top in sys.stdlib_module_names:
        raise BundleError(f"bundle {where}: {top!r} is the name of the grader's own package or "
                          "of Python's standard library: a policy's code may not take it")
    compiled = sorted(f for f in files if "__pycache__" in f.split("/") or f.endswith(COMPILED))
    if compiled:
        raise BundleError(f"bundle {where}: compiled code ({compiled[0]}): a bundle holds "
                          "source only")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON knows")


def _check_fields(value: object, fields: dict, required: bool | None, what: str,
                  where: str) -> None:
    """`value` is absent (unless `required`), or an object of exactly `fields` and their
    types (`required` None: an optional object)."""
    if value is None:
        if required:
            raise BundleError(f"bundle {where}: a model entry needs `model`")
        return
    if required is False:
        raise BundleError(f"bundle {where}: `{what}` belongs to a model entry only")
    if not isinstance(value, dict) or set(value) != set(fields) or any(
            isinstance(value[k], bool) or not isinstance(value[k], t) for k, t in fields.items()):
        raise BundleError(f"bundle {where}: `{what}` must hold exactly "
                          f"{', '.join(fields)}, with their types")
    numbers = [v for v in value.values() if isinstance(v, float)]
    if not all(math.isfinite(v) for v in numbers) or not 0 <= value.get("exact", 0) <= 1:
        raise BundleError(f"bundle {where}: `{what}` holds a number out of range")
