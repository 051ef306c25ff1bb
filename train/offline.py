"""`python -m train offline`: an offline baseline trained on a Minari dataset of `python -m train
dataset`, exported to ONNX and graded by the shared grader.

    python -m train offline --algo bc --dataset finality-full/expert-v0 --datasets runs/datasets \
        --out runs/bc

- `bc`: behaviour cloning, masked. The online baselines' actor (two 128-unit tanh layers to the
  16 logits) fitted by cross-entropy to the dataset's actions, the logits of the actions the env
  masked at that step set to -1e8 (as MaskablePPO masks them), with Adam; a recorded action the
  mask forbade (refused by the env: `result.json`'s `masked_actions`) is left out of the loss.
  Played sampled.
- `cql`: discrete Conservative Q-Learning, Tianshou 2's `DiscreteCQL` (QR-DQN with CQL's
  penalty on the values of actions the data did not take; the env's mask reaches it as
  Tianshou's `obs.mask`): a 128x128 network of 50 quantiles per action, trained on the
  recipe's reward (minus the gap over the order value at the end, from the recorded info) with
  `gamma` 1, Adam, the target network synced every 200 updates. Played greedily on the mean of
  its quantiles, as `sb3:` plays a Q-learner. Why Tianshou's: it is a whole algorithm (the loss,
  the target network, action masks) from a maintained library already in our pins; TorchRL's
  `DiscreteCQLLoss` is a loss only (the loop, the target and the masks would be ours), and
  d3rlpy 2.8.1 pins gymnasium 1.0.0, which our pins exclude.

Both train `epochs` passes over the dataset's transitions in minibatches of `batch_size`, then
are validated (`finality_gym.validation`: every 2nd independent unit of `public` under fault
seed 100, tasks the dataset holds under other seeds; `result.json`'s `best`, so that five seeds
read as a sweep's), exported as `obs`, `action_mask` -> `logits` (`q_values` for `cql`) with the masked
actions at -1e8 and what they were trained for in the metadata (the dataset's env id: `onnx:`
refuses them on another arm), and graded with `onnx:` beside the nine headline policies and the
dataset's own on both splits (`eval_public/`, `eval_regenerated/`; regenerated is never trained
on), as a sweep's seed is, so that `eval versus` pairs them with the online baselines. The run
folder holds `config.json`, `history.jsonl` (the mean loss of every epoch), `model.onnx`,
`result.json` and the graded folders. The same seed gives the same graph, byte for byte.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.learned.trained_for import TrainedFor
from agents.registry import HEADLINE
from eval.sweeps.provenance import machine
from finality_gym.encoder import OBS_FIELDS, action_table

from .dataset import minari_folder

OFFLINE_ALGORITHMS = ("bc", "cql")
NAMES = {"bc": "behaviour cloning (masked)", "cql": "discrete CQL (Tianshou)"}
MASKED = -1e8
QUANTILES = 50


@dataclass(frozen=True)
class OfflineConfig:
    dataset: str                    # the Minari dataset id, e.g. finality-full/expert-v0
    datasets: str                   # the folder holding it (MINARI_DATASETS_PATH)
    out: str                        # the run folder (new or empty)
    algo: str = "bc"                # bc or cql
    seed: int = 0                   # torch's seed: the network's start and the batches' order
    epochs: int = 20                # passes over the dataset's transitions
    batch_size: int = 256           # transitions a gradient step
    learning_rate: float = 1e-3     # Adam's step size
    grade_seeds: int = 5            # episode seeds of the final grading
    workers: int = 2                # grading processes

    def __post_init__(self) -> None:
        if self.algo not in OFFLINE_ALGORITHMS:
            raise ValueError(f"algo: unknown algorithm {self.algo!r}; valid: bc, cql")
        for name in ("epochs", "batch_size", "grade_seeds", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must lie in 0..2**32-1, got {self.seed}")


@dataclass(frozen=True)
class Transitions:
    """Every decision of a dataset: the observation and the env's action mask at it (from the
    recorded info), the action, the training reward (nonzero at an episode's end), the end, and
    the next observation and mask."""

    obs: np.ndarray
    mask: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    ended: np.ndarray
    next_obs: np.ndarray
    next_mask: np.ndarray

    @classmethod
    def of(cls, dataset) -> Transitions:
        parts: dict[str, list] = {f.name: [] for f in dataclasses.fields(cls)}
        for episode in dataset.iterate_episodes():
            n = len(episode.actions)
            infos = episode.infos
            reward = np.zeros(n, dtype=np.float32)
            reward[-1] = -int(infos["gap"][-1]) / int(infos["order_value"][-1])
            ended = np.zeros(n, dtype=bool)
            ended[-1] = bool(infos["ended"][-1])
            for name, value in (("obs", episode.observations[:n]),
                                ("mask", infos["action_mask"][:n]), ("action", episode.actions),
                                ("reward", reward), ("ended", ended),
                                ("next_obs", episode.observations[1:]),
                                ("next_mask", infos["action_mask"][1:])):
                parts[name].append(value)
        arrays = {name: np.concatenate(values) for name, values in parts.items()}
        for name in ("obs", "next_obs"):
            arrays[name] = arrays[name].astype(np.float32)
        arrays["action"] = arrays["action"].astype(np.int64)
        return cls(**arrays)


def loaded(config: OfflineConfig):
    """The dataset, read from `config.datasets`."""
    import minari
    with minari_folder(Path(config.datasets)):
        return minari.load_dataset(config.dataset)


def _log(out: Path, epoch: int, losses: list[float]) -> None:
    with open(out / "history.jsonl", "a") as f:
        f.write(json.dumps({"epoch": epoch, "loss": float(np.mean(losses))}) + "\n")


def fit_bc(config: OfflineConfig, data: Transitions, out: Path):
    """The BC actor, `obs` -> logits."""
    import torch
    from torch import nn
    actor = nn.Sequential(nn.Linear(data.obs.shape[1], 128), nn.Tanh(), nn.Linear(128, 128),
                          nn.Tanh(), nn.Linear(128, data.mask.shape[1]))
    optimizer = torch.optim.Adam(actor.parameters(), lr=config.learning_rate)
    # A recorded action the env's mask forbade (a rule's late ship, or probe in an arm that
    # refuses it) was a real call, refused, but no choice a masked policy can make: the loss
    # leaves it out (its masked logit would make the loss 1e8, and nothing could lower it).
    allowed = data.mask[np.arange(len(data.action)), data.action]
    x, m, y = (torch.as_tensor(a[allowed]) for a in (data.obs, data.mask, data.action))
    for epoch in range(config.epochs):
        losses = []
        for idx in torch.randperm(len(y)).split(config.batch_size):
            loss = nn.functional.cross_entropy(torch.where(m[idx], actor(x[idx]), MASKED), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        _log(out, epoch + 1, losses)
    return actor


def fit_cql(config: OfflineConfig, data: Transitions, out: Path):
    """Tianshou's discrete CQL; the network as `obs` -> mean quantile value of each action."""
    import torch
    from tianshou.algorithm.imitation.discrete_cql import DiscreteCQL
    from tianshou.algorithm.modelfree.qrdqn import QRDQNPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Batch, ReplayBuffer
    from tianshou.utils.net.common import Net
    from tianshou.utils.torch_utils import policy_within_training_step
    from gymnasium import spaces
    n_actions = data.mask.shape[1]
    buffer = ReplayBuffer(len(data.action))
    for i in range(len(data.action)):
        buffer.add(Batch(obs=Batch(obs=data.obs[i], mask=data.mask[i]), act=data.action[i],
                         rew=data.reward[i], terminated=data.ended[i], truncated=False,
                         obs_next=Batch(obs=data.next_obs[i], mask=data.next_mask[i]), info={}))
    net = Net(state_shape=data.obs.shape[1], action_shape=n_actions, hidden_sizes=[128, 128],
              num_atoms=QUANTILES)
    policy = QRDQNPolicy(model=net, action_space=spaces.Discrete(n_actions))
    algorithm = DiscreteCQL(policy=policy, optim=AdamOptimizerFactory(lr=config.learning_rate),
                            gamma=1.0, num_quantiles=QUANTILES, target_update_freq=200)
    updates = max(len(data.action) // config.batch_size, 1)
    with policy_within_training_step(policy):
        for epoch in range(config.epochs):
            _log(out, epoch + 1, [algorithm.update(buffer=buffer, sample_size=config.batch_size)
                                  .loss for _ in range(updates)])

    class Values(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, obs):
            return self.net(obs)[0].mean(2)
    return Values().eval()


def export(network, output: str, env_id: str, path: Path, algorithm: str) -> None:
    """`network` (obs -> logits or values) as ONNX, `obs`, `action_mask` -> masked `output`,
    with its training metadata (`algorithm` names what trained it); `examples/masked_ppo.py`
    exports through it too."""
    import onnx
    import torch

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.network = network

        def forward(self, obs, action_mask):
            return torch.where(action_mask, self.network(obs), MASKED)

    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(Masked(), (torch.zeros(1, len(OBS_FIELDS)),
                                     torch.ones(1, len(action_table()), dtype=bool)),
                          buffer, input_names=["obs", "action_mask"], output_names=[output],
                          dynamic_axes={n: {0: "batch"} for n in ("obs", "action_mask", output)},
                          opset_version=17, dynamo=False)
    model = onnx.load_model_from_string(buffer.getvalue())
    onnx.helper.set_model_props(model, {"finality_gym.algorithm": algorithm,
                                        **TrainedFor.of_env(env_id).onnx_props()})
    path.write_bytes(model.SerializeToString())


def validation(network, sampled: bool, arm: str) -> dict:
    """The network's graded validation (`finality_gym.validation`), played as `onnx:` plays its
    export: sampled with torch's generator seeded from each episode's brief, or greedily
    (`examples/masked_ppo.py` validates its actor through it too)."""
    import torch
    from finality_gym.policy import GymPolicy
    from finality_gym.validation import validate

    def predict(obs: np.ndarray, mask: np.ndarray) -> int:
        with torch.no_grad():
            out = torch.where(torch.as_tensor(mask)[None], network(torch.as_tensor(obs)[None]),
                              MASKED)
            if sampled:
                return int(torch.distributions.Categorical(logits=out).sample()[0])
            return int(out.argmax())
    return validate(GymPolicy("validation", predict, start=torch.manual_seed if sampled else None),
                    arm)


def offline(config: OfflineConfig) -> dict:
    """Train, export and grade; the result (also `out/result.json`)."""
    import torch
    from eval.experiments import headline
    out = Path(config.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} is not an empty folder: pick an empty or new one")
    dataset = loaded(config)
    meta = dataset.storage.metadata["finality_gym"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    torch.use_deterministic_algorithms(True)
    started = time.perf_counter()
    data = Transitions.of(dataset)
    network = (fit_bc if config.algo == "bc" else fit_cql)(config, data, out)
    train_seconds = time.perf_counter() - started
    export(network, "logits" if config.algo == "bc" else "q_values", meta["env_id"],
           out / "model.onnx", NAMES[config.algo])
    samples = len(data.action) * config.epochs
    result = {"dataset": config.dataset, "algo": config.algo, "transitions": len(data.action),
              "masked_actions": int((~data.mask[np.arange(len(data.action)), data.action]).sum()),
              "episodes": dataset.total_episodes, "timesteps": samples,
              "train_seconds": round(train_seconds, 1), "resumed_from": None,
              "best": {"timesteps": samples,
                       **validation(network, config.algo == "bc", meta["arm"])},
              "machines": [{"from_timesteps": 0, **machine()}]}
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    policies = HEADLINE + tuple(meta["policies"]) + (f"onnx:{out / 'model.onnx'}",)
    for split in ("public", "regenerated"):
        headline.run(out / f"eval_{split}", workers=config.workers, progress=False, split=split,
                     seeds=config.grade_seeds, probe=meta["arm"], policies=policies)
    return result
