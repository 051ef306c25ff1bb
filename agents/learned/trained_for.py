"""What a model was trained for, written with it and read back before it is graded: the one
home of that metadata's format.

Every probe arm (`Finality-v0`, `FinalityNoProbe-v0`, ...) has the same observation and action
spaces, so nothing a loader checks tells a model trained without the probe from one trained
with it: graded on another arm, it plays a policy made for a world it never saw, and its row
says nothing of it. So `python -m train` writes, into every archive it saves, and `python -m
train export` into every graph, what it trained on; `check_model` refuses a grading that the
metadata contradicts, and says once when a model has none.

The document (`FORMAT`), one JSON object:

    format              "finality-trained-for/1"
    env_id              the env id trained on: FinalityNoProbe-v0
    probe               its probe arm: none (the id's own, `finality_gym.ENV_IDS`)
    observation_fields  the name of every observation index, in order (58: `OBS_FIELDS`; of
                        one frame, for a model trained on stacked frames)
    actions             the name of every action, in order (16: `action_names`)

- In a stable-baselines3 archive, the zip member `finality.json` (`MEMBER`) beside SB3's own:
  SB3's `load` reads only `data` and the `.pth` members, the safe loader (`sb3_archive`) only
  `data` and `policy.pth`, so both load a stamped archive as they load any.
- In an ONNX graph, the model's `metadata_props` (`onnx_props`): `finality_gym.trained_for` (the
  format), `finality_gym.env_id`, `finality_gym.probe`, and the two lists as JSON text, beside
  the `finality_gym.algorithm` and `finality_gym.source` that export writes.

The observation layout is kept as its names, not as a hash of it and a version: a reader sees
what the model was fed (`unzip -p model.zip finality.json`, any ONNX viewer), and a refusal
names the first index where the model's layout and the grader's part. A change of meaning
that keeps a field's name (a new scale) changes an agent's trajectories, which bumps the env
ids' version (CHANGELOG.md: the ids carry their own, `docs/world.md` section 5.2): the id
recorded then names a version this grader does not know, and the model is refused for that.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from finality_gym.encoder import DEFAULT_WAITS, OBS_FIELDS, action_table
from finality_gym.registration import ENV_IDS

from .sb3_archive import member, opened

FORMAT = "finality-trained-for/1"
MEMBER = "finality.json"
MEMBER_BYTES = 1 << 16  # the document is about 2 KB; read no more than this of a member
PREFIX = "finality_gym."  # of its `metadata_props` keys in an ONNX graph
FIELDS = ("format", "env_id", "probe", "observation_fields", "actions")
MAX_NAMES = 4096  # entries of either list: a layout is tens of names
# (file's SHA-256, arm) of each model a note was printed for in this process
_NOTED: set[tuple[str, str]] = set()


def observation_names() -> tuple[str, ...]:
    """The grader's observation layout: the name of every index the encoder fills."""
    return tuple(name for name, _, _ in OBS_FIELDS)


def action_names(wait_ticks: tuple[int, ...] = DEFAULT_WAITS) -> tuple[str, ...]:
    """Every action's name in index order: the tool, with its argument where it takes one
    (`wait(ticks=10)`, `retry_capture(key=original)`)."""
    return tuple(tool + (f"({', '.join(f'{k}={v}' for k, v in args.items())})" if args else "")
                 for tool, args in action_table(tuple(wait_ticks)))


@dataclass(frozen=True)
class TrainedFor:
    """The document of the module docstring, checked: a known env id with its own arm, and
    the two layouts as tuples of names."""

    env_id: str
    probe: str
    observation_fields: tuple[str, ...]
    actions: tuple[str, ...]

    @classmethod
    def of_env(cls, env_id: str) -> TrainedFor:
        """What a model trained on the registered env `env_id` was fed: its arm and waits as
        the id registers them, the encoder's layout and the action table of those waits."""
        import gymnasium as gym
        if env_id not in ENV_IDS:
            raise ValueError(f"env: unknown id {env_id!r}; valid: {', '.join(ENV_IDS)}")
        kwargs = gym.spec(env_id).kwargs
        return cls(env_id, kwargs["probe"], observation_names(),
                   action_names(kwargs.get("wait_ticks", DEFAULT_WAITS)))

    def to_dict(self) -> dict:
        return {"format": FORMAT, "env_id": self.env_id, "probe": self.probe,
                "observation_fields": list(self.observation_fields),
                "actions": list(self.actions)}

    @classmethod
    def from_dict(cls, data: object, where: str) -> TrainedFor:
        """The document, or a `ValueError` naming `where` and what is wrong with it."""
        if not isinstance(data, dict) or set(data) != set(FIELDS):
            found = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{where}: its training metadata holds {found}, not exactly "
                             f"{', '.join(FIELDS)}")
        if data["format"] != FORMAT:
            raise ValueError(f"{where}: its training metadata is of format {data['format']!r}; "
                             f"this grader reads {FORMAT!r}")
        env_id, probe = data["env_id"], data["probe"]
        if env_id not in ENV_IDS:
            raise ValueError(f"{where} was trained on {env_id!r}, an env id this grader does not "
                             f"know (valid: {', '.join(ENV_IDS)})")
        if probe != ENV_IDS[env_id]:
            raise ValueError(f"{where}: its training metadata names {env_id} with probe arm "
                             f"{probe!r}; that id is probe arm {ENV_IDS[env_id]}")
        for key in ("observation_fields", "actions"):
            names = data[key]
            if not isinstance(names, list) or not 0 < len(names) <= MAX_NAMES or not all(
                    isinstance(n, str) for n in names):
                raise ValueError(f"{where}: its training metadata's {key} is not a list of 1 to "
                                 f"{MAX_NAMES} names")
        return cls(env_id, probe, tuple(data["observation_fields"]), tuple(data["actions"]))

    def onnx_props(self) -> dict[str, str]:
        """The document as an ONNX graph's `metadata_props` (strings only: lists as JSON)."""
        return {PREFIX + ("trained_for" if k == "format" else k):
                v if isinstance(v, str) else json.dumps(v) for k, v in self.to_dict().items()}

    @classmethod
    def from_onnx_props(cls, props: dict[str, str], where: str) -> TrainedFor | None:
        """The document from a graph's `metadata_props`; None when it holds none of its keys."""
        keys = {field: PREFIX + ("trained_for" if field == "format" else field)
                for field in FIELDS}
        present = [k for k in keys.values() if k in props]
        if not present:
            return None
        missing = [k for k in keys.values() if k not in props]
        if missing:
            raise ValueError(f"{where}: its training metadata lacks {', '.join(missing)}")
        data = {}
        for field, key in keys.items():
            try:
                data[field] = json.loads(props[key]) if field.endswith("s") else props[key]
            except ValueError:
                raise ValueError(f"{where}: its metadata {key} is not a JSON list") from None
        return cls.from_dict(data, where)

    def contradiction(self, probe: str) -> str | None:
        """Why grading this model on probe arm `probe`, with the grader's observations and
        actions, would grade a policy it is not; None when nothing contradicts it."""
        if self.probe != probe:
            return (f"was trained on {self.env_id} (probe arm {self.probe}); it is graded on "
                    f"probe arm {probe}")
        for what, theirs, ours in (("observation layout", self.observation_fields,
                                    observation_names()),
                                   ("action table", self.actions, action_names())):
            if theirs != ours:
                i = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b),
                         min(len(theirs), len(ours)))
                said = lambda names: repr(names[i]) if i < len(names) else "absent"  # noqa: E731
                return (f"was trained with an {what} of {len(theirs)} names, index {i} "
                        f"{said(theirs)}; the grader's has {len(ours)}, index {i} {said(ours)}")
        return None


def stamp(path: Path, trained: TrainedFor) -> None:
    """Add the document to the SB3 archive at `path` (one just saved: an archive that holds one
    already is refused, since a zip keeps both copies of a name)."""
    with zipfile.ZipFile(path, "a") as archive:
        if MEMBER in archive.namelist():
            raise ValueError(f"{path} already says what it was trained for ({MEMBER})")
        archive.writestr(MEMBER, json.dumps(trained.to_dict(), indent=1) + "\n")


def read_archive(path: Path) -> TrainedFor | None:
    """The document of an SB3 archive, or None if it has none; read within `MEMBER_BYTES`."""
    where = str(path)
    with opened(path, where) as archive:
        if MEMBER not in archive.namelist():
            return None
        text = member(archive, MEMBER, MEMBER_BYTES, where, "trained_for.MEMBER_BYTES")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where}: its {MEMBER} is not JSON ({exc})") from None
    return TrainedFor.from_dict(data, where)


def read_onnx(path: Path) -> TrainedFor | None:
    """The document of an ONNX graph's metadata, or None if it has none."""
    import onnx
    try:
        model = onnx.load_model_from_string(path.read_bytes())
    except Exception as exc:  # protobuf's DecodeError, or whatever a foreign file makes it meet
        raise ValueError(f"{path} is not an ONNX model ({exc})") from None
    return TrainedFor.from_onnx_props({p.key: p.value for p in model.metadata_props}, str(path))


def check_model(path: Path, graph: bool, probe: str, name: str) -> TrainedFor | None:
    """Refuse (`ValueError`, naming `name`, the arm trained on and the arm graded on) to grade
    the model at `path` (an ONNX graph if `graph`, else an SB3 archive) on probe arm `probe`
    where its metadata contradicts it; a model without metadata is graded on the arm declared,
    with a one-line note on stderr, once per model and arm in this process."""
    found = read_onnx(path) if graph else read_archive(path)
    if found is None:
        key = (hashlib.sha256(path.read_bytes()).hexdigest(), probe)
        if key not in _NOTED:
            _NOTED.add(key)
            print(f"note: {name} does not say what it was trained for (no training metadata): "
                  f"graded on probe arm {probe}, as declared", file=sys.stderr, flush=True)
        return None
    why = found.contradiction(probe)
    if why is not None:
        raise ValueError(f"{name} {why}: refused")
    return found
