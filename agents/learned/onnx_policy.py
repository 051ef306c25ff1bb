"""A policy network as an ONNX graph (`onnx:PATH`, `onnx-greedy:PATH`), run by onnxruntime in the
grader's own process.

Nothing from the file runs but the graph: the file is read once, checked, and the session is
made from those same bytes. A graph whose tensors live in external data files (which
onnxruntime would read from paths the file names), that uses an operator domain other than the
standard ones (`ai.onnx`, `ai.onnx.ml`: a custom domain is code someone else must supply), or
whose inputs and outputs do not fit the contract is refused by name, before anything is played.
Every session runs on one thread (one small forward pass per step, one session per worker).

A graph runs in the grader's process, so its cost is bounded before a session is made
(`bounded`, `Bounds`): operators of policy networks only (`OPERATORS`: no control flow, whose
cost depends on the data, no random operator, which would change a graded row from one grading
to the next), and every tensor's shape inferred from the inputs' at the batch of one the grader
feeds, so that each tensor's elements, their sum and a call's work are known and capped; a call
that still runs past `Bounds.call_seconds` is stopped (`_Watchdog`). The load check plays the
graph on real observations and masks of the env (`learned.real_steps`), not on zeros only.

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

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from finality_gym.policy import GymPolicy

from .policy import MASKED, Exponentials, probabilities, real_steps
from .sb3_archive import finality_spaces

OBS, MASK, STATE_IN = "obs", "action_mask", "state_in"
LOGITS, Q_VALUES, STATE_OUT = "logits", "q_values", "state_out"
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
_FLOAT, _BOOL = "tensor(float)", "tensor(bool)"
# The operators a graph may use: what `python -m train export` and torch.onnx write for MLP,
# LSTM, GRU and small convolutional policies, and their everyday kin; each one's cost follows
# from its tensors' shapes (`_work`).
OPERATORS = frozenset("""
    Abs Add And ArgMax ArgMin BatchNormalization Cast CastLike Ceil Celu Clip Concat Constant
    ConstantOfShape Conv Cos Div Dropout Elu Equal Erf Exp Expand Flatten Floor GRU Gather
    GatherElements Gelu Gemm Greater GreaterOrEqual HardSigmoid HardSwish Identity IsInf IsNaN
    LSTM LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax MatMul Max Mean Min Mish
    Mod Mul Neg Not Or PRelu Pad Pow RNN Reciprocal ReduceL1 ReduceL2 ReduceLogSumExp ReduceMax
    ReduceMean ReduceMin ReduceProd ReduceSum Relu Reshape Round Selu Shape Sigmoid Sign Sin Size
    Slice Softmax Softplus Softsign Split Sqrt Squeeze Sub Sum Tanh Tile Transpose Unsqueeze
    Where Xor""".split())
RANDOM = frozenset("Bernoulli Multinomial RandomNormal RandomNormalLike RandomUniform "
                   "RandomUniformLike".split())
CONTROL_FLOW = frozenset(("If", "Loop", "Scan"))
_MULTIPLY_ADDS = ("MatMul", "Gemm", "Conv", "LSTM", "GRU", "RNN")  # `_work` counts their products
_KEPT = 1024  # initializers of at most this many elements keep their values for inference


@dataclass(frozen=True)
class Bounds:
    """What one graph may cost the grader, per call at the batch of one the grader feeds: all
    checked before a session is made (`bounded`) but the wall time, watched on every call
    (`_Watchdog`). Far above a policy network's needs (the shipped PPO: 7 operators, 26,000
    elements, 26,000 units of work) and far below what stalls or floods the grader."""

    nodes: int = 4096  # operators in the graph
    tensor_elements: int = 1 << 22  # one tensor: a 2048 x 2048 weight, 16 MiB in float32
    total_elements: int = 1 << 24  # every tensor, the weights included: 64 MiB in float32
    work: int = 1 << 24  # multiply-adds, and elements read and written by other operators
    call_seconds: float = 2.0  # one call's wall time; `work` keeps a call near 20 ms at most


BOUNDS = Bounds()


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


def checked_graph(path: Path, bounds: Bounds = BOUNDS) -> bytes:
    """The file's bytes, once they parse as an ONNX model with no external data and no operator
    outside the standard domains, pass onnx's own checker and are within `bounds`."""
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
    bounded(model, path, bounds)
    return data


def bounded(model, path: Path, bounds: Bounds = BOUNDS) -> None:
    """Refuses, naming the limit, a graph whose cost the grader cannot know or would not bear:
    more than `bounds.nodes` operators, a local function, an operator outside `OPERATORS` (control
    flow and random operators by name) or a Dropout that may train; a tensor whose shape does
    not follow from the inputs' at a batch of one (onnx's shape inference, values of shapes
    propagated); a tensor over `bounds.tensor_elements`, all of them over
    `bounds.total_elements`, a call's work over `bounds.work`. `model` is changed (its declared
    shapes, which the inference must not take on trust, are cleared; its large weights emptied:
    only their shapes count)."""
    onnx, _ = _onnx_modules()
    graph = model.graph
    if len(graph.node) > bounds.nodes:
        raise ValueError(f"{path} has {len(graph.node)} operators, over the limit of "
                         f"{bounds.nodes} (Bounds.nodes)")
    if model.functions:
        raise ValueError(f"{path} defines local functions ({model.functions[0].name}): the "
                         "grader runs the standard operators only (OPERATORS)")
    for node in graph.node:
        why = _refusal(node)
        if why:
            raise ValueError(f"{path}: its operator {node.name or node.output[0]!r} is a "
                             f"{node.op_type}, {why}")
    shapes = _inferred(onnx, model, path)
    for name, shape in shapes.items():
        if math.prod(shape) > bounds.tensor_elements:
            raise ValueError(f"{path}: its tensor {name!r} has {math.prod(shape):,} elements "
                             f"{list(shape)}, over the limit of {bounds.tensor_elements:,} "
                             "(Bounds.tensor_elements)")
    total = sum(math.prod(shape) for shape in shapes.values())
    if total > bounds.total_elements:
        raise ValueError(f"{path}: its tensors have {total:,} elements in all, over the limit "
                         f"of {bounds.total_elements:,} (Bounds.total_elements)")
    work = sum(_work(node, shapes) for node in graph.node)
    if work > bounds.work:
        raise ValueError(f"{path}: a call would do {work:,} units of work (multiply-adds, "
                         f"elements read and written), over the limit of {bounds.work:,} "
                         "(Bounds.work)")


def _refusal(node) -> str | None:
    """Why an operator is refused, if it is."""
    if node.op_type in RANDOM:
        return ("a random operator: a grade must be a function of the bundle, the same rows on "
                "every grading (OPERATORS)")
    if node.op_type in CONTROL_FLOW:
        return ("control flow, whose cost depends on the data it meets: the grader bounds a "
                "graph before it runs it (OPERATORS)")
    if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
        return "with a training_mode input: it may draw random numbers (OPERATORS)"
    if node.op_type not in OPERATORS or node.domain not in ("", "ai.onnx"):
        return "not an operator the grader runs (OPERATORS: those of policy networks)"
    return None


def _inferred(onnx, model, path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape (inputs, weights, every operator's outputs), inferred by onnx from
    the inputs' shapes with the batch dimension 1, or the tensor whose shape is not known."""
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in weights and dims and not dims[0].HasField("dim_value"):
            dims[0].dim_value = 1
    del graph.value_info[:]
    for value in graph.output:
        value.type.tensor_type.ClearField("shape")
    for tensor in graph.initializer:  # only a shape's values matter: the weights' go
        if math.prod(tensor.dims) > _KEPT:
            tensor.CopyFrom(onnx.TensorProto(name=tensor.name, data_type=tensor.data_type,
                                             dims=tensor.dims))
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                     data_prop=True).graph
    except Exception as exc:  # onnx's InferenceError names the operator
        raise ValueError(f"{path}: its shapes do not follow from its inputs ({exc})") from None
    shapes = {t.name: tuple(t.dims) for t in inferred.initializer}
    shapes |= {s.values.name: tuple(s.dims) for s in inferred.sparse_initializer}
    for value in [*inferred.input, *inferred.value_info, *inferred.output]:
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else None
        if dims is not None and value.type.tensor_type.HasField("shape") and all(
                d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
            shapes.setdefault(value.name, tuple(d.dim_value for d in dims))
    for node in graph.node:
        for name in (n for n in [*node.input, *node.output] if n and n not in shapes):
            raise ValueError(f"{path}: the shape of {name!r} ({node.op_type}) does not follow "
                             "from the inputs' at a batch of one: the grader bounds only a "
                             "graph whose every tensor's shape it knows before it runs")
    return shapes


def _work(node, shapes: dict[str, tuple[int, ...]]) -> int:
    """A call's work in one operator: its multiply-adds for `_MULTIPLY_ADDS`, else the elements
    it reads and writes."""
    ins = [shapes[name] for name in node.input if name]
    outs = [math.prod(shapes[name]) for name in node.output if name]
    if node.op_type == "MatMul":
        return outs[0] * (ins[0][-1] if ins[0] else 1)
    if node.op_type == "Gemm":
        transposed = any(a.name == "transA" and a.i for a in node.attribute)
        return outs[0] * ins[0][0 if transposed else 1]
    if node.op_type == "Conv":
        return outs[0] * math.prod(ins[1][1:])
    if node.op_type in _MULTIPLY_ADDS:  # a recurrent layer: at every step, its W and R
        return ins[0][0] * ins[0][1] * (math.prod(ins[1]) + math.prod(ins[2]))
    return sum(math.prod(shape) for shape in ins) + sum(outs)


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


def signature(session, path: Path, seconds: float = BOUNDS.call_seconds) -> Signature:
    """The graph's inputs and outputs checked against the contract (the module docstring), then
    the graph played on real observations (`_probe`, each call within `seconds`)."""
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
    _probe(session, found, path, actions, seconds)
    return found


def _check(path: Path, arg, types: list[str], width: int, what: str, exact: bool) -> None:
    """An input or output of type one of `types` and shape [N, width], N dynamic or 1. An
    input's width must be declared (`exact`); an output's may be left to shape inference,
    which `_probe` then checks on real forward passes."""
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


def _probe(session, found: Signature, path: Path, actions: int, seconds: float) -> None:
    """The load check: the graph played one call a step through every step of `real_steps`,
    its state carried through each episode as the runner carries it, each call watched
    (`seconds`): its outputs must have the contract's shapes and an action value to act on."""
    runner = _Runner(session, found, True, actions, seconds)
    expected = [(1, actions)] + ([(1, *found.state)] if found.state is not None else [])
    try:
        for obs, mask, first in real_steps():
            if first:
                runner.start(0)
            try:
                result = runner.forward(obs, mask)
            except Exception as exc:  # onnxruntime's errors name the node that failed
                raise ValueError(f"{path} failed on an observation: {exc}") from None
            for name, value, shape in zip(found.outputs, result, expected):
                if value.shape != shape or value.dtype != np.float32:
                    raise ValueError(f"{path}: {name} came out {value.dtype} "
                                     f"{list(value.shape)} for one observation, not float32 "
                                     f"{list(shape)}")
            if not np.isfinite(result[0].max()):
                raise ValueError(f"{path}: {found.action} came out {result[0][0].tolist()} on "
                                 "an observation of the env: no action to choose")
    finally:
        runner.watch.stop()


class _Watchdog:
    """A wall-time limit on each call of a session: a thread of this process's own sets
    onnxruntime's `RunOptions.terminate` once a call has run `seconds`, and the session stops
    between two operators (`Bounds.work` keeps each operator short) and raises. `start` runs it
    in the process that plays (a forked worker starts its own); `stop` ends it, so that loading
    a graph leaves no thread behind (a fork server refuses an import that does)."""

    def __init__(self, seconds: float):
        _, ort = _onnx_modules()
        self.seconds = seconds
        self.options = ort.RunOptions()
        self.started: float | None = None
        self.thread: threading.Thread | None = None
        self.pid = 0

    def start(self) -> None:
        if self.thread is not None and self.pid == os.getpid():
            return
        self.pid, self.stopping = os.getpid(), threading.Event()
        self.thread = threading.Thread(target=self._watch, args=(self.stopping,), daemon=True,
                                       name="onnx-call-watchdog")
        self.thread.start()

    def stop(self) -> None:
        if self.thread is not None and self.pid == os.getpid():
            self.stopping.set()
            self.thread.join()
        self.thread = None

    def _watch(self, stopping: threading.Event) -> None:
        while not stopping.wait(self.seconds / 4):
            started = self.started
            if started is not None and time.monotonic() - started > self.seconds:
                self.options.terminate = True

    def run(self, session, outputs: list[str], feed: dict) -> list:
        self.started = time.monotonic()
        try:
            return session.run(outputs, feed, self.options)
        except Exception:
            if self.options.terminate:
                raise ValueError(f"a call of the graph ran past {self.seconds:g} s "
                                 "(Bounds.call_seconds) and was stopped") from None
            raise
        finally:
            self.started = None


class _Runner:
    """One session played one step at a time: the observation (and mask, and state) in, an
    action out, as the module docstring says; each call watched (`_Watchdog`)."""

    def __init__(self, session, found: Signature, greedy: bool, actions: int,
                 seconds: float = BOUNDS.call_seconds):
        self.session = session
        self.outputs = found.outputs
        self.mask = found.mask
        self.state_shape = found.state
        self.state = None
        greedy = greedy or found.action == Q_VALUES
        self.draws = None if greedy else Exponentials(actions)
        self.watch = _Watchdog(seconds)

    def start(self, seed: int) -> None:
        self.watch.start()
        if self.state_shape is not None:
            self.state = np.zeros((1, *self.state_shape), dtype=np.float32)
        if self.draws is not None:
            self.draws.seed(seed)

    def forward(self, obs: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
        """The graph's outputs for one step; the state carried on to the next."""
        feed = {OBS: obs.reshape(1, -1)}
        if self.mask is not None:
            feed[MASK] = mask.reshape(1, -1) if self.mask is bool else mask.astype(
                np.float32).reshape(1, -1)
        if self.state is not None:
            feed[STATE_IN] = self.state
        result = self.watch.run(self.session, self.outputs, feed)
        if self.state is not None:
            self.state = result[1]
        return result

    def predict(self, obs: np.ndarray, mask: np.ndarray) -> int:
        values = self.forward(obs, mask)[0][0]
        if not np.isfinite(values.max()):  # NaN, +inf, or every action -inf
            raise ValueError(f"the graph gave {values.tolist()}: no action to choose")
        used = mask if self.mask is not None else None
        if self.draws is None:
            return int(np.argmax(values if used is None else np.where(used, values,
                                                                        np.float32(MASKED))))
        return int(np.argmax(probabilities(values, used) / self.draws.draw()))


def load_onnx(path: str | Path, greedy: bool = False, bounds: Bounds = BOUNDS) -> GymPolicy:
    """The ONNX policy `onnx:PATH` (or `onnx-greedy:PATH` when `greedy`) names, checked as the
    module docstring says before anything is played, and played within `bounds`."""
    path = Path(path)
    data = checked_graph(path, bounds)
    try:
        session = open_session(data)
    except Exception as exc:  # onnxruntime refuses what it cannot run, in its own words
        raise ValueError(f"{path} could not be loaded by onnxruntime: {exc}") from None
    runner = _Runner(session, signature(session, path, bounds.call_seconds), greedy,
                     int(finality_spaces()["action"].n), bounds.call_seconds)
    return GymPolicy(f"onnx{'-greedy' if greedy else ''}:{path}", runner.predict,
                     start=runner.start)
