"""The episode that was graded, rebuilt by the engine from its row: the site shows what the grader
saw, not a new play of the policy (`finality_gym.episode.replay` of the task, the seed and the
calls the grader recorded, in the world the run pinned), and says whether the rebuilt record is
the graded one."""

from __future__ import annotations

from finality_gym import load_corpus
from finality_gym.corpus import PRIVATE
from finality_gym.economics import Costs
from finality_gym.episode import Episode, EpisodeRecord, replay
from finality_gym.faults import FaultProfile

NO_CALLS = ("this folder was graded before the grader recorded each episode's calls: its record "
            "is shown, but not its calls nor its picture (grade it again into a new folder to "
            "see them)")


class World:
    """How a run's episodes were played (its run.json's split, fault profile, costs, probe
    arm and guard), to rebuild them; a run of the private split is not rebuilt (its tasks need
    its master seed). A fault profile or costs that are not one are refused (ValueError)."""

    def __init__(self, manifest: dict):
        self.split = manifest.get("split", "public")
        self.private = self.split == PRIVATE
        self.corpus = None if self.private else load_corpus(self.split)
        faults = manifest.get("faults")
        self.faults = None if faults is None else FaultProfile.from_dict(faults)
        costs = manifest.get("costs")
        self.costs = None if costs is None else Costs.from_dict(costs)
        self.probe = manifest.get("probe", "full")
        self.guard = manifest.get("guard", False)

    def episode(self, row: dict) -> Episode:
        return replay(self.corpus.task(row["task_id"]), row["seed"], row["calls"],
                      row["lapsed"], faults=self.faults, probe=self.probe, costs=self.costs,
                      guard=self.guard)


def replayed(world: World, row: dict) -> tuple[list | None, str]:
    """The row's calls with their results, rebuilt by the engine, and whether the rebuilt
    record is the graded one (`ok`, or why not)."""
    if "calls" not in row:
        return None, NO_CALLS
    if world.private:
        return None, "the private split's episodes are not rebuilt: its tasks need its master seed"
    try:
        episode = world.episode(row)
    except (ValueError, KeyError) as exc:
        return None, f"the recorded calls do not replay: {exc}"
    calls = [[t, tool, args, {k: v for k, v in result.items() if k not in ("tool", "t")}]
             for t, tool, args, result in episode.history]
    try:  # the row is the grader's: its policy and stats beside the record's fields
        graded = EpisodeRecord.from_dict({k: row[k] for k in EpisodeRecord._fields if k in row})
    except ValueError as exc:
        return calls, f"the calls replay, but the row holds no episode record ({exc})"
    differ = [k for k, a, b in zip(EpisodeRecord._fields, episode.record(), graded) if a != b]
    if differ:
        return calls, f"the calls replay, but to another record ({', '.join(differ)} differ)"
    return calls, "ok"
