"""`python -m eval submit POLICY --name NAME --out BUNDLE`: a policy as a submission bundle
(`eval/board/bundle.py`), checked to load in the safe form before the file is written.

    python -m eval submit my_policy.py:MyPolicy --name mine --out mine.finality
    python -m eval submit mypkg.agent:Agent --name pkg --out pkg.finality    # the whole package
    python -m eval submit onnx:model.onnx --name net --out net.finality
    python -m eval submit sb3:best_model.zip --name ppo --out ppo.finality  # + vecnormalize.pkl
    python -m eval submit onnx:noprobe.onnx --name np --probe none --out np.finality  # its arm
    python -m eval submit model:gpt-x --name gpt-x --temperature 0 --param seed=7 --out m.finality
    python -m eval submit finality_gate --name gate --out gate.finality     # a baseline

`--claimed-summary FILE` adds the author's own public-split figures (a `summary.json` the
author's `python -m eval headline --policies POLICY` wrote): `verify` grades the public split too
and flags a claim outside its interval.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agents import PolicySpec
from agents.spec import FORMS, module_file
from agents.learned.trained_for import check_model
from agents.learned.vecnormalize import normalization_file
from finality_gym.episode import PROBE_ARMS

from eval.board.bundle import DEFAULT_PROBE, KINDS, BundleError, bundle_of, pack, write_new
from eval.board.loading import check_loads

SKIPPED = ("__pycache__",)


def _package_files(target: str) -> dict:
    """An outside module's whole top-level package (or its module file), as the sandbox shows
    it (`agents/sandbox/bwrap.py`): every regular file, bytecode caches left out; a link is
    refused."""
    source = module_file(target)
    parts = target.split(".")
    depth = len(parts) if source.name != "__init__.py" else len(parts) + 1
    entry = source.parents[depth - 1]
    top = entry / parts[0]
    if not top.is_dir():
        return {f"{parts[0]}.py": top.with_suffix(".py").read_bytes()}
    files = {}
    for path in sorted(top.rglob("*")):
        if path.is_symlink():
            raise BundleError(f"{path} is a symbolic link: a bundle holds regular files only")
        if path.is_file() and not any(p in SKIPPED for p in path.relative_to(entry).parts):
            files[path.relative_to(entry).as_posix()] = path.read_bytes()
    return files


def contents(spec: str) -> tuple[str, str, dict]:
    """(kind, the spec relative to the bundle, its files) of a policy spec."""
    parsed = PolicySpec.parse(spec)
    kind = next(k for k, kinds in KINDS.items() if parsed.kind in kinds)
    if kind in ("scripted", "model"):
        return kind, str(parsed), {}
    if kind == "outside":
        if parsed.target.endswith(".py"):
            source = parsed.source()
            return kind, f"{source.name}:{parsed.arguments}", {source.name: source.read_bytes()}
        return kind, str(parsed), _package_files(parsed.target)
    source = parsed.source()
    name = "model.onnx" if kind == "onnx" else "model.zip"
    files = {name: source.read_bytes()}
    normalization = normalization_file(source) if kind == "sb3" else None
    if normalization is not None:
        files["vecnormalize.pkl"] = normalization.read_bytes()
    return kind, f"{parsed.kind}:{name}", files


def claimed(path: Path | None, policy: str | None) -> dict | None:
    """The author's public-split figures from a `summary.json`: its one policy's, or
    `policy`'s."""
    if path is None:
        return None
    try:
        summary = json.loads(path.read_text())
        policies = summary["policies"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"--claimed-summary {path}: not a summary.json ({exc})") from None
    if summary.get("split") != "public":
        raise BundleError(f"--claimed-summary {path}: a claim is of the public split, this "
                          f"summary is of {summary.get('split')!r}")
    if policy is None and len(policies) != 1:
        raise BundleError(f"--claimed-summary {path} holds {len(policies)} policies: name "
                          "yours with --claimed-policy")
    figures = policies.get(policy) if policy is not None else next(iter(policies.values()))
    if figures is None:
        raise BundleError(f"--claimed-policy {policy}: not in {path}")
    return {"mean_gap": figures["mean_gap"], "exact": figures["exact"]}


def submit(spec: str, name: str, out: Path, model: dict | None = None,
           claim: dict | None = None, probe: str = DEFAULT_PROBE) -> str:
    """Write the bundle of `spec` to `out`, checked to load; return its SHA-256. `model`: a
    model entry's settings (`bundle.MODEL_FIELDS`); `probe`: the arm the entry is graded on,
    which a model's training metadata must not contradict (named as the submitter named it,
    before anything is packed: `trained_for.check_model`)."""
    if probe not in PROBE_ARMS:
        raise BundleError(f"--probe: unknown arm {probe!r}; valid: {', '.join(PROBE_ARMS)}")
    kind, relative, files = contents(spec)
    if kind in ("sb3", "onnx"):
        parsed = PolicySpec.parse(spec)
        try:
            check_model(parsed.source(), kind == "onnx", probe, str(parsed))
        except ValueError as exc:
            raise BundleError(f"{exc} (--probe names the arm an entry is graded on)") from None
    manifest = {"name": name, "kind": kind, "spec": relative, "probe": probe,
                **({"model": model} if kind == "model" else {}),
                **({"claimed": claim} if claim is not None else {})}
    data = pack(manifest, files)
    bundle = bundle_of(data, str(out))
    check_loads(bundle, submitting=True)
    write_new(out, data)
    return bundle.sha256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help=f"the policy, a spec of the forms {FORMS} (a module's "
                                     "whole package goes in)")
    parser.add_argument("--name", required=True, help="the entry's name on the board")
    parser.add_argument("--out", type=Path, required=True, help="the bundle file to create")
    parser.add_argument("--claimed-summary", type=Path, default=None,
                        help="your public-split summary.json, checked by verify")
    parser.add_argument("--claimed-policy", default=None,
                        help="your policy's name in it, if it holds several")
    parser.add_argument("--probe", choices=PROBE_ARMS, default=DEFAULT_PROBE,
                        help=f"the probe arm the entry is graded on (default {DEFAULT_PROBE}); "
                             "a model trained for another is refused")
    model = parser.add_argument_group("a model entry (model:NAME): its request settings")
    model.add_argument("--temperature", type=float, default=0.0)
    model.add_argument("--max-tokens", type=int, default=1024, help="per response")
    model.add_argument("--max-total-tokens", type=int, default=None, help="per episode")
    model.add_argument("--param", action="append", default=[], metavar="KEY=JSON",
                       help="one more request field, repeatable (as `eval model --param`)")
    model.add_argument("--no-param", action="append", default=[], metavar="KEY",
                       help="a field never sent, repeatable")
    model.add_argument("--price-in", type=float, default=None,
                       help="dollars per million prompt tokens: the board's cost per episode")
    model.add_argument("--price-out", type=float, default=None,
                       help="dollars per million completion tokens")


def main(args: argparse.Namespace) -> int:
    params = []
    for text in args.param:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {text}: expected KEY=JSON")
        params.append([key, value])
    model = {"temperature": args.temperature, "max_tokens": args.max_tokens,
             "max_total_tokens": args.max_total_tokens, "params": params,
             "no_params": list(args.no_param), "price_in": args.price_in,
             "price_out": args.price_out}
    digest = submit(args.spec, args.name, args.out, model,
                    claimed(args.claimed_summary, args.claimed_policy), args.probe)
    print(f"submit: wrote {args.out} (sha256 {digest}); give it to the operator, who runs "
          f"python -m eval verify {args.out.name} --master-seed-file F --out BOARD")
    return 0
