"""A policy network as an ONNX graph (`onnx:PATH`, `onnx-greedy:PATH`), run by onnxruntime in the
grader's own process.

Nothing from the file runs but the graph: the file is read once, checked, and the session is
made from those same bytes. A graph whose tensors live in external data files (which
onnxruntime would read from paths the file names), that uses an operator domain other than the
standard ones (`ai.onnx`, `ai.onnx.ml`: a custom domain is code someone else must supply), or
whose inputs and outputs do not fit the contract is refused by name, before anything is played.
Every session runs on one thread (one small forward pass per step, one session per worker).

The contract (docs/usage.md, "ONNX policies"), with the names `python -m train export` writes:

    obs           input, float32 [N, obs_dim]: the env's observation (`ObservationEncoder`),
                  obs_dim = 58 for Finality-v0; N is the batch (dynamic, or 1)
    action_mask   optional input, bool or float32 [N, 16]: the env's action masks; a graph
                  that takes it is played as MaskablePPO plays (masked actions get -1e8)
    state_in      optional input, float32 [N, ...]: a recurrent state, zeros at an episode's
                  start, then the `state_out` of the step before (both or neither)
    logits        output, float32 [N, 16]: unnormalized log-probabilities of the 16 actions
    q_values      instead of `logits`: action values, acted on greedily under both specs (a
                  Q-learner's policy is the argmax of its values, as `sb3:` plays DQN)
    state_out     optional output, float32, the shape of `state_in`

Other inputs are refused (nothing would feed them); other outputs are never computed.

`onnx:PATH` samples from the logits as SB3's `Categorical` does: the probabilities as it makes
them (`probabilities`: normalized by their log-sum-exp, masked and normalized again as
`MaskableCategorical` does when the graph takes the mask, then the softmax), and the action
`torch.multinomial` picks from them with the random numbers it draws (`Exponentials`), from a
torch generator seeded from the brief's seed at each episode's start, as `torch.manual_seed`
seeds `sb3:`'s. A model graded through `sb3:` and through `onnx:` plays the same actions wherever
the two runtimes' probabilities agree to float precision (docs/usage.md says how often they do
not). The draws need torch (the `train` extra); `onnx-greedy:PATH` takes the argmax of the
(masked) logits with numpy and needs only the `onnx` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .learned import GymPolicy
from .sb3_archive import finality_spaces

OBS, MASK, STATE_IN = "obs", "action_mask", "state_in"
LOGITS, Q_VALUES, STATE_OUT = "logits", "q_values", "state_out"
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
MASKED = -1e8  # what MaskablePPO gives a masked action's logit
_FLOAT, _BOOL = "tensor(float)", "tensor(bool)"


@dataclass(frozen=True)
class Signature:
    """What a graph takes and gives, once checked against the contract: the action output
    (`logits` or `q_values`), the mask's dtype if it takes the mask, and the recurrent state's
    shape after the batch dimension if it keeps one."""

    action: str
    mask: type | None
    state: tuple[int, ...] | None

    @property
    def outputs(self) -> list[str]:
        return [self.action, STATE_OUT] if self.state is not None else [self.action]


def _onnx_modules():
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise ImportError("onnx:PATH and onnx-greedy:PATH need the 'onnx' extra: "
                          "pip install -e .[onnx]") from exc
    return onnx, onnxruntime


def checked_graph(path: Path) -> bytes:
    """The file's bytes, once they parse as an ONNX model with no external data and no operator
    outside the standard domains, and pass onnx's own checker."""
    onnx, _ = _onnx_modules()
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX model at {path}")
    data = path.read_bytes()
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError, or whatever a foreign file makes it meet
        raise ValueError(f"{path} is not an ONNX model ({exc})") from None
    external = list(_external_tensors(model.graph))
    if external:
        raise ValueError(f"{path} keeps tensors in external data ({', '.join(external[:3])}): "
                         "the grader runs only a self-contained graph (save it with "
                         "save_as_external_data=False)")
    domains = sorted({o.domain for o in model.opset_import} | _node_domains(model.graph)
                     | {n.domain for f in model.functions for n in f.node}
                     | {f.domain for f in model.functions})
    custom = [d for d in domains if d not in STANDARD_DOMAINS]
    if custom:
        raise ValueError(f"{path} uses the operator domain(s) {', '.join(custom)}: the grader "
                         "runs only the standard ONNX operators (ai.onnx, ai.onnx.ml)")
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ValueError(f"{path} is not a valid ONNX model: {exc}") from None
    return data


def _subgraphs(graph):
    """`graph` and every graph nested in its nodes' attributes (the branches of an `If`, the
    body of a `Loop` or a `Scan`)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _subgraphs(sub)


def _external_tensors(graph):
    """The names of the tensors, anywhere in the graph, whose data lives outside the file."""
    for g in _subgraphs(graph):
        tensors = list(g.initializer) + [t for s in g.sparse_initializer
                                         for t in (s.values, s.indices)]
        for node in g.node:
            for attribute in node.attribute:
                tensors += ([attribute.t] if attribute.HasField("t") else []) + list(
                    attribute.tensors)
                if attribute.HasField("sparse_tensor"):
                    tensors += [attribute.sparse_tensor.values, attribute.sparse_tensor.indices]
        for tensor in tensors:
            if tensor.data_location == 1 or tensor.external_data:  # TensorProto.EXTERNAL
                yield tensor.name or "(unnamed)"


def _node_domains(graph) -> set[str]:
    return {node.domain for g in _subgraphs(graph) for node in g.node}


def open_session(data: bytes):
    """An onnxruntime session of a checked graph, on one thread, on the CPU."""
    _, ort = _onnx_modules()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: its warnings would print in every worker
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def signature(session, path: Path) -> Signature:
    """The graph's inputs and outputs checked against the contract (the module docstring), then
    one forward pass on the start of an episode, whose outputs must have the contract's shapes."""
    obs_dim = finality_spaces()["observation"].shape[0]
    actions = int(finality_spaces()["action"].n)
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    unknown = sorted(set(inputs) - {OBS, MASK, STATE_IN})
    if unknown or OBS not in inputs:
        raise ValueError(f"{path} takes the input(s) {', '.join(sorted(inputs))}; the contract "
                         f"is {OBS} (and optionally {MASK}, {STATE_IN})")
    _check(path, inputs[OBS], [_FLOAT], obs_dim, "the observation", exact=True)
    mask = None
    if MASK in inputs:
        _check(path, inputs[MASK], [_BOOL, _FLOAT], actions, "the action mask", exact=True)
        mask = bool if inputs[MASK].type == _BOOL else np.float32
    action = [name for name in (LOGITS, Q_VALUES) if name in outputs]
    if len(action) != 1:
        raise ValueError(f"{path} gives the output(s) {', '.join(sorted(outputs))}; the contract "
                         f"is one of {LOGITS} or {Q_VALUES} (and {STATE_OUT} with {STATE_IN})")
    _check(path, outputs[action[0]], [_FLOAT], actions, "the actions' values", exact=False)
    if (STATE_IN in inputs) != (STATE_OUT in outputs):
        raise ValueError(f"{path} has {STATE_IN if STATE_IN in inputs else STATE_OUT} without "
                         f"{STATE_OUT if STATE_IN in inputs else STATE_IN}: a recurrent state "
                         "goes in and comes out")
    state = None
    if STATE_IN in inputs:
        state = _state_shape(path, inputs[STATE_IN])
    found = Signature(action[0], mask, state)
    _probe(session, found, path, obs_dim, actions)
    return found


def _check(path: Path, arg, types: list[str], width: int, what: str, exact: bool) -> None:
    """An input or output of type one of `types` and shape [N, width], N dynamic or 1. An
    input's width must be declared (`exact`); an output's may be left to shape inference,
    which `_probe` then checks on a real forward pass."""
    if arg.type not in types:
        raise ValueError(f"{path}: {arg.name} ({what}) is {arg.type}, not "
                         f"{' or '.join(types)}")
    shape = arg.shape
    if shape is None:
        return
    fits = len(shape) == 2 and _batch(shape[0]) and (
        shape[1] == width if exact else not isinstance(shape[1], int) or shape[1] == width)
    if not fits:
        raise ValueError(f"{path}: {arg.name} ({what}) has the shape {shape}, not "
                         f"[N, {width}] (N dynamic or 1)")


def _batch(dim) -> bool:
    """A batch dimension the runner can feed one observation: dynamic (a name, or unknown) or 1."""
    return not isinstance(dim, int) or dim == 1


def _state_shape(path: Path, arg) -> tuple[int, ...]:
    shape = arg.shape
    if arg.type != _FLOAT or not shape or len(shape) < 2 or not _batch(shape[0]) or not all(
            isinstance(d, int) and d > 0 for d in shape[1:]):
        raise ValueError(f"{path}: {STATE_IN} is {arg.type} {shape}, not float32 [N, ...] "
                         "with fixed dimensions after N")
    return tuple(shape[1:])


def _probe(session, found: Signature, path: Path, obs_dim: int, actions: int) -> None:
    """One forward pass on a zero observation, every action allowed, a zero state."""
    feed = {OBS: np.zeros((1, obs_dim), dtype=np.float32)}
    if found.mask is not None:
        feed[MASK] = np.ones((1, actions), dtype=found.mask)
    if found.state is not None:
        feed[STATE_IN] = np.zeros((1, *found.state), dtype=np.float32)
    try:
        result = session.run(found.outputs, feed)
    except Exception as exc:  # onnxruntime's errors name the node that failed
        raise ValueError(f"{path} failed on an observation: {exc}") from None
    expected = [(1, actions)] + ([(1, *found.state)] if found.state is not None else [])
    for name, value, shape in zip(found.outputs, result, expected):
        if value.shape != shape or value.dtype != np.float32:
            raise ValueError(f"{path}: {name} came out {value.dtype} {list(value.shape)} for "
                             f"one observation, not float32 {list(shape)}")


class Exponentials:
    """The random numbers `torch.multinomial(probs, 1, True)` draws to sample one action (as
    SB3's `Categorical.sample()` calls it): one `exponential_` of a float32 [1, n] tensor from a
    torch generator, the action being the argmax of `probs / draws` (torch's own fast path for a
    single sample). The generator is seeded as `torch.manual_seed(seed)` seeds torch's, so the
    draws are those `sb3:` makes."""

    def __init__(self, n: int):
        try:
            import torch
        except ImportError as exc:
            raise ImportError("onnx:PATH samples with torch's generator, as sb3: does: it needs "
                              "the 'train' extra (pip install -e .[train]); onnx-greedy:PATH "
                              "needs only the 'onnx' extra") from exc
        self.generator = torch.Generator()
        self.tensor = torch.empty((1, n), dtype=torch.float32)
        self.array = self.tensor.numpy()  # the same memory

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def draw(self) -> np.ndarray:
        self.tensor.exponential_(1.0, generator=self.generator)
        return self.array[0]


def probabilities(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """SB3's `Categorical(logits=...)` probabilities, in float32 (`MaskableCategorical`'s, the
    mask applied, when `mask` is given): the logits normalized by their log-sum-exp, masked and
    normalized again, then their softmax."""
    logits = logits - _logsumexp(logits)
    if mask is not None:
        logits = np.where(mask, logits, np.float32(MASKED))
        logits = logits - _logsumexp(logits)
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


def _logsumexp(x: np.ndarray) -> np.float32:
    top = x.max()
    return top + np.log(np.exp(x - top).sum())


class _Runner:
    """One session played one step at a time: the observation (and mask, and state) in, an
    action out, as the module docstring says."""

    def __init__(self, session, found: Signature, greedy: bool, actions: int):
        self.session = session
        self.outputs = found.outputs
        self.mask = found.mask
        self.state_shape = found.state
        self.state = None
        greedy = greedy or found.action == Q_VALUES
        self.draws = None if greedy else Exponentials(actions)

    def start(self, seed: int) -> None:
        if self.state_shape is not None:
            self.state = np.zeros((1, *self.state_shape), dtype=np.float32)
        if self.draws is not None:
            self.draws.seed(seed)

    def predict(self, obs: np.ndarray, mask: np.ndarray) -> int:
        feed = {OBS: obs.reshape(1, -1)}
        if self.mask is not None:
            feed[MASK] = mask.reshape(1, -1) if self.mask is bool else mask.astype(
                np.float32).reshape(1, -1)
        if self.state is not None:
            feed[STATE_IN] = self.state
            values, self.state = self.session.run(self.outputs, feed)
        else:
            values, = self.session.run(self.outputs, feed)
        values = values[0]
        if not np.isfinite(values.max()):  # NaN, +inf, or every action -inf
            raise ValueError(f"the graph gave {values.tolist()}: no action to choose")
        used = mask if self.mask is not None else None
        if self.draws is None:
            return int(np.argmax(values if used is None else np.where(used, values,
                                                                        np.float32(MASKED))))
        return int(np.argmax(probabilities(values, used) / self.draws.draw()))


def load_onnx(path: str | Path, greedy: bool = False) -> GymPolicy:
    """The ONNX policy `onnx:PATH` (or `onnx-greedy:PATH` when `greedy`) names, checked as the
    module docstring says before anything is played."""
    path = Path(path)
    data = checked_graph(path)
    try:
        session = open_session(data)
    except Exception as exc:  # onnxruntime refuses what it cannot run, in its own words
        raise ValueError(f"{path} could not be loaded by onnxruntime: {exc}") from None
    runner = _Runner(session, signature(session, path), greedy,
                     int(finality_spaces()["action"].n))
    return GymPolicy(f"onnx{'-greedy' if greedy else ''}:{path}", runner.predict,
                     start=runner.start)
