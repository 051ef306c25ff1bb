"""The factory: every policy by its spec (`agents/spec.py` parses them; `agents/registry.py`
names the project's own): the project's scripted policies, open-loop plans, saved stable-baselines3
models (loaded as data, no pickle of the archive run, unless `allow_pickle`:
`agents/learned/policy.py`), policy networks as ONNX graphs (run by onnxruntime:
`agents/learned/onnx_policy.py`) and policies from outside the project, graded in their own process
(`agents/sandbox/external.py`). A language model (`model:NAME`) needs an endpoint: `python -m eval
model` builds it (`agents/model/`)."""

from __future__ import annotations

from pathlib import Path

from . import scripted
from .sandbox.external import ExternalPolicy
from .registry import CLASSES
from .scripted.env_actions import EnvActions
from .spec import ONNX, PolicySpec
from finality_gym.policy import Policy


def make_policy(spec: str | PolicySpec, sandbox: bool = True, allow_pickle: bool = False,
                probe: str | None = None) -> Policy:
    """The policy a spec names; an outside one runs in the operating-system sandbox unless
    `sandbox` is False (`agents/sandbox/`); a saved model is loaded as data unless
    `allow_pickle` is True, which runs the pickles inside its archive, in this process
    (`agents/learned/policy.py`: for files one trusts).

    `probe`, the arm the policy is about to be graded on, is checked here against what a model
    says it was trained for (`agents/learned/trained_for.py`), once loaded: every command that
    grades makes its policies here, so a model graded on an arm its metadata contradicts is
    refused wherever it is graded, and one without metadata gets its note. None (a grader's
    worker, whose run's main process checked the same file) checks nothing."""
    parsed = spec if isinstance(spec, PolicySpec) else PolicySpec.parse(spec)
    if parsed.kind == "outside":
        return ExternalPolicy(parsed, sandbox=sandbox)
    if parsed.kind in ONNX or parsed.learned:
        if parsed.kind in ONNX:
            from .learned.onnx_policy import load_onnx
            policy = load_onnx(parsed.target, greedy=parsed.kind == "onnx-greedy")
        else:
            from .learned.policy import load_sb3
            policy = load_sb3(parsed.target, greedy=parsed.kind.endswith("-greedy"),
                              kind=parsed.kind.removesuffix("-greedy"), allow_pickle=allow_pickle)
        if probe is not None:
            from .learned.trained_for import check_model
            check_model(Path(parsed.target), parsed.kind in ONNX, probe, str(parsed))
        return policy
    if parsed.kind == "model":
        raise ValueError(f"{parsed} is a language model: grade it with python -m eval model "
                         "--model NAME --base-url URL")
    if parsed.kind == "env":
        inner = PolicySpec.parse(parsed.target)
        if inner.kind not in ("scripted", "plan"):
            raise ValueError(f"{parsed}: env: takes a rule or a plan (NAME, sop:..., plan:...), "
                             f"not a spec of kind {inner.kind!r}")
        return EnvActions(make_policy(inner))
    if parsed.kind == "plan":
        parts = parsed.target.split(",")
        if len(parts) != 4 or not parts[0].isdigit() or not parts[2].isdigit():
            raise ValueError(f"bad plan {str(parsed)!r}; expected plan:W1,RETRY,W2,TERMINAL")
        return scripted.OpenLoopPlan(int(parts[0]), parts[1], int(parts[2]), parts[3])
    name, rest = parsed.target, parsed.arguments
    if not rest:
        return CLASSES[name]()
    if name != "sop":
        raise ValueError(f"policy {name!r} takes no knobs, got {rest!r}")
    knobs = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq or key not in ("poll_interval", "max_polls") or not value.isdigit():
            raise ValueError(f"bad knob {item!r} in {str(parsed)!r}; sop takes poll_interval=INT, "
                             "max_polls=INT")
        knobs[key] = int(value)
    return scripted.SOP(**knobs)
