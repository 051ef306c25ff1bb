"""`python -m train export MODEL.zip|RUN --onnx OUT`: a saved stable-baselines3 model as the ONNX
graph `onnx:OUT` grades (the contract: `agents/learned/onnx_policy.py`, docs/usage.md "ONNX
policies").

The model is read as data the way the grader reads it (`agents/learned/sb3_archive.py`: the
archive's JSON and its weights as plain tensors, no pickle run); a training run folder (`RUN`)
gives its `best_model.zip`. Every algorithm `sb3:` grades exports (`agents/learned/algorithms.py`):

    PPO, A2C, TRPO    obs -> logits (the actor: features, the actor's MLP, the action head)
    MaskablePPO       obs, action_mask -> logits, a masked action's logit -1e8 as MaskablePPO's
    RecurrentPPO      obs, state_in -> logits, state_out: the actor's LSTM, one step; the state
                      [N, 2, layers, hidden] holds its hidden and cell states, zeros at the start
    DQN, QR-DQN, ARS  obs -> q_values (QR-DQN's the mean of its quantiles; ARS's its linear
                      scores): played greedily, as `sb3:` plays them

with a dynamic batch dimension. Before the file is written, the graph runs in onnxruntime,
through the grader's own checks (`agents/learned/onnx_policy.py`), on `OBSERVATIONS` observations of
real episodes of `Finality-v0` (every probe arm; the model's own greedy action or a random
allowed one, half and half, seeded: the same observations every export), batched and one step
at a time (a recurrent state carried through each episode), and its outputs are compared with
what SB3's policy computes from the same inputs: the log-probabilities of its distribution (of
the allowed actions, for MaskablePPO) or its action values. If the largest difference exceeds
`TOLERANCE` times the largest magnitude compared (at least 1), nothing is written.

A model saved with a `vecnormalize.pkl` is refused: the normalization would have to become part
of the graph, and the statistics are not yet readable outside `agents/learned/vecnormalize.py`.

The graph's metadata says what the model was trained for (`agents/learned/trained_for.py`: the
env id, its probe arm, the observation layout and the action table), so that `onnx:` refuses to
grade it on another arm: for a run folder, from the run's `config.json` (its `env`, and that
env's spaces), which an archive's own record must not contradict; for a bare archive, from its
own `finality.json` (`python -m train` writes one into every archive it saves). An archive
without one (saved by another trainer, or before 0.2.0) is exported without it, and said so.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.learned.algorithms import Algorithm
from agents.learned.onnx_policy import (LOGITS, MASK, MASKED, OBS, Q_VALUES, STATE_IN, STATE_OUT,
                                checked_graph, open_session, signature)
from agents.learned.sb3_archive import built_policy, finality_spaces, read_data
from agents.learned.trained_for import TrainedFor, read_archive
from agents.learned.vecnormalize import normalization_file
from finality_gym.env import FinalityEnv
from finality_gym.episode import PROBE_ARMS

from .config import TrainConfig

OBSERVATIONS = 300  # compared before writing, in whole episodes
TOLERANCE = 1e-4    # largest |onnxruntime - torch|, relative to the values' scale (at least 1)
OPSET = 17
BATCH = "batch"


@dataclass(frozen=True)
class Exported:
    """What `export` wrote: the algorithm, the model it read, the observations compared and the
    largest difference found (`scale` is what the tolerance was multiplied by)."""

    algorithm: str
    model: Path
    out: Path
    observations: int
    episodes: int
    difference: float
    scale: float
    trained_for: TrainedFor | None = None


def model_file(source: Path) -> Path:
    """A model archive, or a training run folder's best model."""
    if source.is_dir():
        best = source / "best_model.zip"
        if not best.is_file():
            raise FileNotFoundError(f"{source} holds no best_model.zip (not a training run "
                                    "folder, or no validation has run yet)")
        return best
    if not source.is_file():
        raise FileNotFoundError(f"no model file or run folder at {source}")
    return source


def trained_for(source: Path, path: Path) -> TrainedFor | None:
    """What the model at `path` (`source`'s, a run folder's best model or the archive itself)
    was trained for: a run folder's `config.json` says it (its `env`), and the archive's own
    record, if it has one, must agree; a bare archive says it itself, or nothing."""
    own = read_archive(path)
    saved = source / "config.json" if source.is_dir() else None
    if saved is None or not saved.is_file():
        return own
    try:
        env = TrainConfig.from_json(saved.read_text()).env
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{saved} is not a run configuration ({exc})") from None
    run = TrainedFor.of_env(env)
    if own is not None and own != run:
        other = "" if own.env_id != run.env_id else " with another observation layout or actions"
        raise ValueError(f"{path} says it was trained on {own.env_id} (probe arm {own.probe})"
                         f"{other}, its run's {saved} says {run.env_id} (probe arm {run.probe}):"
                         " they must agree (export the archive itself to take its own word)")
    return run


def export(source: Path, out: Path) -> Exported:
    """Export `source` (a model archive or a run folder) to `out`, checked as the module
    docstring says; `out` is written whole or not at all."""
    import torch
    path, out = model_file(Path(source)), Path(out)
    if not out.parent.is_dir():
        raise FileNotFoundError(f"no folder {out.parent} to write {out.name} in")
    data, algorithm, stack = read_data(path, "sb3")
    trained = trained_for(Path(source), path)
    if stack > 1:
        raise ValueError(f"{path} stacks {stack} observations (--frame-stack): the onnx: "
                         "contract takes one observation a step; grade the model itself with "
                         "sb3:PATH")
    if normalization_file(path) is not None:
        raise ValueError(f"{path} has an observation normalization saved with it "
                         f"({normalization_file(path)}): export does not bake VecNormalize into "
                         "the graph; grade the model itself with sb3:PATH")
    torch.set_num_threads(1)
    policy = built_policy(path, data, algorithm.cls())
    graph = _graph(policy, algorithm)
    episodes = _episodes(policy, algorithm)
    onnx_bytes = _onnx(graph, algorithm, path, trained)
    partial = out.with_name(f"{out.stem}.partial{out.suffix}")
    try:
        partial.write_bytes(onnx_bytes)
        session = open_session(checked_graph(partial))
        signature(session, partial)
        difference, scale = _compare(session, policy, algorithm, episodes)
        if difference > TOLERANCE * scale:
            raise ValueError(f"onnxruntime's outputs differ from torch's by up to {difference:.2e}"
                             f" on {sum(map(len, episodes))} observations (tolerance "
                             f"{TOLERANCE * scale:.2e}): {out} not written")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return Exported(algorithm.name, path, out, sum(map(len, episodes)), len(episodes),
                    difference, scale, trained)


# ------------------------------------------------------------------------- the graphs
def _graph(policy, algorithm: Algorithm):
    """The torch module exported: the part of the policy that maps an observation to its
    actions' logits or values."""
    import torch
    from stable_baselines3.common.policies import BaseModel

    def features(obs):  # the actor's features (an actor-critic may keep the critic's apart)
        return BaseModel.extract_features(policy, obs, policy.pi_features_extractor)

    class Actor(torch.nn.Module):
        def forward(self, obs):
            return policy.action_net(policy.mlp_extractor.forward_actor(features(obs)))

    class Masked(torch.nn.Module):
        def forward(self, obs, action_mask):
            logits = policy.action_net(policy.mlp_extractor.forward_actor(features(obs)))
            return torch.where(action_mask, logits, torch.full_like(logits, MASKED))

    class Recurrent(torch.nn.Module):
        def forward(self, obs, state_in):
            # [N, 2, layers, hidden] -> the hidden and the cell state, [layers, N, hidden] each
            h, c = (state_in[:, i].transpose(0, 1).contiguous() for i in (0, 1))
            out, (h, c) = policy.lstm_actor(features(obs).unsqueeze(0), (h, c))  # one step
            logits = policy.action_net(policy.mlp_extractor.forward_actor(out[0]))
            return logits, torch.stack((h.transpose(0, 1), c.transpose(0, 1)), dim=1)

    class Values(torch.nn.Module):
        def forward(self, obs):
            return _values(policy, algorithm, obs)

    if algorithm.recurrent:
        module = Recurrent()
    elif algorithm.masked:
        module = Masked()
    else:
        module = Actor() if algorithm.sampled else Values()
    module.policy = policy  # registered, so the export sees the weights as the graph's
    return module.eval()


def _values(policy, algorithm: Algorithm, obs):
    """A greedy-by-nature policy's action values: DQN's Q-values, QR-DQN's mean quantiles,
    ARS's linear scores (what each one's `_predict` takes the argmax of)."""
    if algorithm.name == "QRDQN":
        return policy.quantile_net(obs).mean(dim=1)
    if algorithm.name == "ARS":
        return policy.action_net(policy.extract_features(obs, policy.features_extractor))
    return policy.q_net(obs)


def _state_shape(policy) -> tuple[int, int, int]:
    lstm = policy.lstm_actor
    return 2, lstm.num_layers, lstm.hidden_size


def _onnx(graph, algorithm: Algorithm, path: Path, trained: TrainedFor | None) -> bytes:
    """The graph as ONNX (TorchScript's exporter, `dynamo=False`: the dynamo exporter needs
    onnxscript), with a dynamic batch, named as the contract names, and where it came from and
    what it was trained for (if known) in its metadata."""
    import onnx
    import torch
    spaces = finality_spaces()
    args = [torch.zeros(1, *spaces["observation"].shape)]
    inputs, outputs = [OBS], [LOGITS if algorithm.sampled else Q_VALUES]
    if algorithm.masked:
        args.append(torch.ones(1, int(spaces["action"].n), dtype=torch.bool))
        inputs.append(MASK)
    if algorithm.recurrent:
        args.append(torch.zeros(1, *_state_shape(graph.policy)))
        inputs.append(STATE_IN)
        outputs.append(STATE_OUT)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(graph, tuple(args), buffer, input_names=inputs, output_names=outputs,
                          dynamic_axes={name: {0: BATCH} for name in inputs + outputs},
                          opset_version=OPSET, dynamo=False)
    model = onnx.load_model_from_string(buffer.getvalue())
    onnx.helper.set_model_props(model, {
        "finality_gym.algorithm": algorithm.name,
        "finality_gym.source": path.name,
        "finality_gym.source_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        **(trained.onnx_props() if trained is not None else {})})
    return model.SerializeToString()


# ------------------------------------------------------------------------- the check
Step = tuple[np.ndarray, np.ndarray]  # an observation and the action mask that came with it


def _episodes(policy, algorithm: Algorithm) -> list[list[Step]]:
    """Whole episodes of `Finality-v0`, `OBSERVATIONS` observations or a few more, the probe
    arms in turn: each step the model's own greedy action (its LSTM state carried) or a random
    allowed one, half and half, from fixed seeds."""
    rng = np.random.default_rng(0)
    envs = [FinalityEnv(probe=arm) for arm in PROBE_ARMS]
    episodes: list[list[Step]] = []
    while sum(map(len, episodes)) < OBSERVATIONS:
        env = envs[len(episodes) % len(envs)]
        obs, _ = env.reset(seed=len(episodes))
        steps, state, done = [], None, False
        while not done:
            mask = env.action_masks()
            steps.append((obs, mask))
            extra = {"action_masks": mask} if algorithm.masked else {}
            if algorithm.recurrent:
                extra = {"state": state, "episode_start": np.array([len(steps) == 1])}
            action, state = policy.predict(obs, deterministic=True, **extra)
            if rng.random() < 0.5:
                action = rng.choice(np.flatnonzero(mask))
            obs, _, terminated, truncated, _ = env.step(int(action))
            done = terminated or truncated
        episodes.append(steps)
    return episodes


def _compare(session, policy, algorithm: Algorithm, episodes: list[list[Step]]
             ) -> tuple[float, float]:
    """The largest difference between onnxruntime's outputs and SB3's, and the largest
    magnitude compared (at least 1): every observation in one batch (from a zero state), then
    each episode one step at a time (its state carried, for a recurrent model)."""
    steps = [step for episode in episodes for step in episode]
    batch = (np.stack([obs for obs, _ in steps]), np.stack([mask for _, mask in steps]))
    found = [_difference(session, policy, algorithm, *batch, None)]
    for episode in episodes:
        state = None
        for obs, mask in episode:
            found.append(_difference(session, policy, algorithm, obs[None], mask[None], state))
            state = found[-1][2]
    return max(f[0] for f in found), max(f[1] for f in found)


def _difference(session, policy, algorithm: Algorithm, obs: np.ndarray, mask: np.ndarray,
                state) -> tuple[float, float, object]:
    """(largest |onnx - sb3|, largest |sb3| or 1, the states after this step: (onnx's, SB3's))
    for one batch of observations; an actor-critic's logits are compared as log-probabilities
    (SB3's distribution normalizes them), over the allowed actions for MaskablePPO."""
    import torch
    feed = {OBS: obs}
    if algorithm.masked:
        feed[MASK] = mask
    if algorithm.recurrent:
        feed[STATE_IN] = np.zeros((len(obs), *_state_shape(policy)), dtype=np.float32) \
            if state is None else state[0]
    outputs = session.run(None, feed)
    ours = outputs[0].astype(np.float64)
    with torch.no_grad():
        tensor = torch.as_tensor(obs)
        if algorithm.recurrent:
            size = (policy.lstm_actor.num_layers, len(obs), policy.lstm_actor.hidden_size)
            lstm = (torch.zeros(size), torch.zeros(size)) if state is None else state[1]
            distribution, lstm = policy.get_distribution(tensor, lstm, torch.zeros(len(obs)))
            theirs = distribution.distribution.logits
        elif algorithm.masked:
            theirs = policy.get_distribution(tensor, action_masks=mask).distribution.logits
        elif algorithm.sampled:
            theirs = policy.get_distribution(tensor).distribution.logits
        else:
            theirs = _values(policy, algorithm, tensor)
    theirs = theirs.double().numpy()
    if algorithm.sampled:
        ours = ours - np.log(np.exp(ours - ours.max(1, keepdims=True)).sum(1, keepdims=True)) \
            - ours.max(1, keepdims=True)
    compared = mask if algorithm.masked else np.ones_like(ours, dtype=bool)
    difference = float(np.abs(ours - theirs)[compared].max())
    scale = max(1.0, float(np.abs(theirs[compared]).max()))
    after = (outputs[1], lstm) if algorithm.recurrent else None
    return difference, scale, after
