"""RecurrentPPO's gradient updates with each sequence's LSTM run in one call, not step by step,
and its minibatches padded by one numpy indexing, not a tensor a sequence.

sb3-contrib's `RecurrentActorCriticPolicy._process_sequence` runs the LSTM over a minibatch's
padded sequences one time step at a time (a Python loop of LSTM calls, forward and backward, for
the actor's LSTM and the critic's) whenever any sequence starts an episode, so that it can reset
the state at that step. Its rollout buffer cuts a sequence at every episode start, so an episode
starts only at the first step of a sequence; here, where most episodes last a few steps, nearly
every minibatch has one, and the loop took most of the training time (`benchmarks/ppo_speed.py
--recurrent`). Resetting each sequence's initial state where it starts an episode and running
the whole sequence in one LSTM call computes the same outputs (the padding after a sequence's end
cannot reach its earlier steps, and is masked out of the loss anyway). A minibatch with an episode
start anywhere else (never made by sb3-contrib's buffer) still takes the step-by-step loop.
The buffer's `pad` made a tensor of every sequence of every field of every minibatch before
padding them (about 200,000 small tensors for 8,192 steps, a sixth of the time once the loop was
gone); `padded` builds the same padded array in one indexing.

Only training uses them (`train/run.py` calls `fast_updates()` before building a RecurrentPPO
model): the saved model is sb3-contrib's own policy class, unchanged, and grading it steps one
observation at a time, where both ways are one call. One LSTM call over a sequence rounds its sums
otherwise than a call a step, so a run with it is not bit-identical to one without it; each is
bit-identical to itself (`tests/training/test_memory.py`).
"""

from __future__ import annotations

import numpy as np
import torch as th
from sb3_contrib.common.recurrent import buffers
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy

STEP_BY_STEP = RecurrentActorCriticPolicy._process_sequence
STOCK_PAD = buffers.pad


def process_sequence(features: th.Tensor, lstm_states: tuple[th.Tensor, th.Tensor],
                     episode_starts: th.Tensor, lstm: th.nn.LSTM) -> tuple[th.Tensor, tuple]:
    """`_process_sequence` with the arguments and results of sb3-contrib's: the LSTM over
    `features` ((n_seq x length) x input, sequence-major) from `lstm_states`, each sequence's
    state zeroed where its first step starts an episode."""
    n_seq = lstm_states[0].shape[1]
    starts = episode_starts.reshape((n_seq, -1))
    if bool(starts[:, 1:].any()):  # an episode starting inside a sequence
        return STEP_BY_STEP(features, lstm_states, episode_starts, lstm)
    keep = (1.0 - starts[:, 0]).view(1, n_seq, 1)
    sequences = features.reshape((n_seq, -1, lstm.input_size)).swapaxes(0, 1)
    output, states = lstm(sequences, (keep * lstm_states[0], keep * lstm_states[1]))
    return th.flatten(output.transpose(0, 1), start_dim=0, end_dim=1), states


def padded(seq_start_indices: np.ndarray, seq_end_indices: np.ndarray, device: th.device,
           tensor: np.ndarray, padding_value: float = 0.0) -> th.Tensor:
    """sb3-contrib's `buffers.pad`, same arguments and result: the sequences of `tensor` from
    each start to its end (inclusive; the last end may be one past the array) as an
    (n_seq, longest, ...) tensor, `padding_value` after each sequence's end."""
    ends = np.minimum(seq_end_indices + 1, len(tensor))
    lengths = ends - seq_start_indices
    steps = np.arange(lengths.max())
    inside = steps[None, :] < lengths[:, None]
    out = np.full((len(lengths), len(steps), *tensor.shape[1:]), padding_value, dtype=tensor.dtype)
    out[inside] = tensor[(seq_start_indices[:, None] + steps[None, :])[inside]]
    return th.as_tensor(out, device=device)


def fast_updates() -> None:
    """Make every RecurrentPPO of this process run its sequences in one call and pad its
    minibatches in one indexing."""
    RecurrentActorCriticPolicy._process_sequence = staticmethod(process_sequence)
    buffers.pad = padded
