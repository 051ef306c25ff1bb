"""`python -m train dataset`: a Minari dataset of scripted policies' decisions on one probe arm,
for offline RL, with D4RL's reference scores so that `minari.get_normalized_score` works on it.

    python -m train dataset --family expert --arm full --out datasets

Families (D4RL's names, fixed rules whatever the arm: off the full arm the gate is no expert,
it has no probe answer to wait for): `expert` the finality gate; `medium` `react` and `reflection`; `mixed`
the eight unprivileged policies of the headline (the nine less the oracle, whose calls are the
truth's), in equal shares; `random` the random policy. Each episode is one (task, fault seed)
of the `public` split, the split the online baselines train on (so that grading on
`regenerated` asks the same question of generalization), every task under every seed of
`--seeds`, the family's policies taking the episodes in turn.

The transitions are ones the env really produced: each policy is played through the env
(`gym.make(id, split="public")`, reset to the episode's task and fault seed) as its env-action
version (`env:NAME`, `agents/scripted/env_actions.py`: every wait one of the env's four), fed
each call's result as the grader feeds it, its call recorded as the env's action index; so each
episode is the one the shared grader plays for `env:NAME` on that task and seed. Recorded:
observations, actions, rewards (the env's: minus the gap in dollars over 100), terminations,
truncations and the env's numeric info of every step (the action mask among it).

Metadata: `ref_min_score` is the random policy's mean return and `ref_max_score` the oracle's
(0: its gap is 0), over the dataset's own episodes (`num_episodes_average_score` of them, on
`public`), in the env's reward (`minari.get_normalized_score` gives a fraction, 1 the oracle's); the same in the grade
(mean gap in dollars) under `finality_gym` in the metadata, with the policies, the arm, the
split's fingerprint, the seeds and the package version. The same command writes the same
dataset, byte for byte, on one machine.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

import finality_gym
from agents import make_policy
from agents.registry import HEADLINE
from finality_gym.episode import PROBE_ARMS
from finality_gym.policy import brief_for

FAMILIES = {
    "expert": ("finality_gate",),
    "medium": ("react", "reflection"),
    "mixed": tuple(name for name in HEADLINE if name != "finality_oracle"),
    "random": ("random",),
}
REWARD_SCALE = 100  # the env's default: a return is minus the gap in dollars over 100


@dataclass(frozen=True)
class DatasetConfig:
    """What one dataset holds: `family` (or `policies`, a tuple of rule names, for a family of
    one's own), the probe `arm`, the fault `seeds`, and `tasks` (all of `public` when None)."""

    family: str
    arm: str = "full"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    tasks: tuple[str, ...] | None = None
    policies: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.policies is None and self.family not in FAMILIES:
            raise ValueError(f"family: unknown family {self.family!r}; valid: "
                             f"{', '.join(FAMILIES)}")
        if self.arm not in PROBE_ARMS:
            raise ValueError(f"arm: unknown probe arm {self.arm!r}; valid: {', '.join(PROBE_ARMS)}")
        if not self.seeds or any(type(s) is not int or s < 0 for s in self.seeds):
            raise ValueError(f"seeds: a non-empty tuple of ints >= 0; got {self.seeds!r}")
        for name in self.members:
            make_policy(f"env:{name}")  # a bad name or a privileged one, refused now

    @property
    def members(self) -> tuple[str, ...]:
        return self.policies if self.policies is not None else FAMILIES[self.family]

    @property
    def env_id(self) -> str:
        return next(i for i, arm in finality_gym.ENV_IDS.items() if arm == self.arm)

    @property
    def dataset_id(self) -> str:
        return f"finality-{self.arm}/{self.family}-v0"

    def episodes(self) -> list[tuple[str, str, int]]:
        """(policy, task id, fault seed) of every episode, in the order they are recorded."""
        corpus = finality_gym.load_corpus("public")
        tasks = self.tasks if self.tasks is not None else tuple(t.task_id for t in corpus.tasks)
        cases = [(task, seed) for seed in self.seeds for task in tasks]
        members = self.members
        return [(members[i % len(members)], task, seed) for i, (task, seed) in enumerate(cases)]


def play(collector, index: int, spec: str, task_id: str, seed: int, arm: str) -> None:
    """Episode `index` of the dataset: `env:spec` through the collector's env, as the grader
    plays it. Its reset seed is its index: the episode is the options' (task and fault seed),
    and a seed of Minari's choosing, kept with the episode, would make every build differ."""
    policy = make_policy(f"env:{spec}")
    collector.reset(seed=index, options={"task_id": task_id, "fault_seed": seed})
    episode = collector.unwrapped.episode
    policy.reset(brief_for(episode.task, seed, arm))
    result, done = None, False
    while not done:
        action = policy.action_index(policy.act(result))
        _, _, terminated, truncated, _ = collector.step(action)
        result = episode.history[-1][3]
        done = terminated or truncated


def reference_gaps(config: DatasetConfig) -> dict[str, float]:
    """The random policy's and the oracle's mean gap in dollars over the dataset's episodes,
    graded by the shared grader."""
    from eval.grading.grader import RunConfig, grade_in_process
    cases = sorted({(task, seed) for _, task, seed in config.episodes()})
    out = {}
    for name in ("random", "finality_oracle"):
        rows = [row for seed in sorted({s for _, s in cases}) for row in grade_in_process(
            make_policy(name), name, RunConfig((name,), split="public", seeds=(seed,),
                                               probe=config.arm,
                                               tasks=tuple(t for t, s in cases if s == seed)))]
        out[name] = float(np.mean([r["gap"] for r in rows]) / 100)
    return out


@contextmanager
def minari_folder(folder: Path):
    """Minari's datasets folder (`MINARI_DATASETS_PATH`, the only way to name it) set to
    `folder` for the block, then as it was."""
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(Path(folder).resolve())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous


def build(config: DatasetConfig, out: Path):
    """Write the dataset into `out` (Minari's datasets folder for it); the dataset."""
    from minari import DataCollector
    out = Path(out).resolve()
    target = out / config.dataset_id
    if target.exists():
        raise ValueError(f"{target} exists: pick another --out or remove it")
    collector = DataCollector(gym.make(config.env_id, split="public"), record_infos=True)
    for index, (spec, task_id, seed) in enumerate(config.episodes()):
        play(collector, index, spec, task_id, seed, config.arm)
    gaps = reference_gaps(config)
    with minari_folder(out):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="`author_email` is set to None")
            dataset = collector.create_dataset(
                dataset_id=config.dataset_id, algorithm_name=f"env:{'+'.join(config.members)}",
                author="finality-gym", code_permalink="train/dataset.py",
                eval_env=gym.make(config.env_id, split="regenerated"),
                ref_min_score=0.0 - gaps["random"] / REWARD_SCALE,
                ref_max_score=0.0 - gaps["finality_oracle"] / REWARD_SCALE,
                num_episodes_average_score=len({(t, s) for _, t, s in config.episodes()}),
                description=f"{config.family}: {', '.join(config.members)} as env-action "
                            f"policies on the {config.arm} probe arm, public split; evaluate "
                            "on regenerated (eval_env)")
    dataset.storage.update_metadata({"finality_gym": {
        "family": config.family, "policies": [f"env:{p}" for p in config.members],
        "arm": config.arm, "env_id": config.env_id, "split": "public",
        "split_fingerprint": finality_gym.load_corpus("public").fingerprint,
        "seeds": list(config.seeds), "version": finality_gym.__version__,
        "ref_min_gap": gaps["random"], "ref_max_gap": gaps["finality_oracle"]}})
    collector.close()
    return dataset
