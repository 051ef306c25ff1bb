"""A bundle's policy made ready to grade: its files extracted into a folder and its spec pointed
at them (`located`), the policy loaded in the safe form only (outside code in the sandbox, a
saved model as data) or, for a model entry, its settings with the operator's endpoint
(`model_config`). `check_loads` is what `submit` and `verify` both ask of a bundle before
anything is written.

The grader never runs in the bundle's folder and never puts it on its own import path (a
process started there would import the bundle's files before the standard library's): its
spec names the files by absolute path, and only an outside package's module is looked up on a
path that includes the folder (`PYTHONPATH`, which the grader reads to find the module's file,
after the working directory and the repository: the lookup must land in the folder, and the
package's name must be one the grader's interpreter does not know)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

from agents import PolicySpec, make_policy
from agents.sandbox.external import ExternalPolicy
from agents.learned.trained_for import check_model
from agents.model import ModelConfig
from agents.spec import module_file

from eval.board.bundle import Bundle, BundleError

PLACEHOLDER_URL = "http://127.0.0.1:1/v1"  # a model entry's settings are checked without one
POLICY_SHOWN = "<bundle>"  # the scratch folder's name in a refusal


def is_package(bundle: Bundle) -> bool:
    """An outside policy submitted as a package (found on an import path), not a file."""
    return bundle.kind == "outside" and not PolicySpec.parse(bundle.spec).target.endswith(".py")


@contextmanager
def _on_path(folder: Path):
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def located(bundle: Bundle, folder: Path, submitting: bool = False):
    """A context in which `spec` (returned on entering) loads the bundle's policy from its
    files extracted in `folder` (an absolute path). `submitting`: on the submitter's machine,
    where their package is found on their own path (its copy in `folder` is the same code), the
    two checks that guard the operator's grader are left out."""
    parsed = PolicySpec.parse(bundle.spec)
    if bundle.kind in ("sb3", "onnx"):
        return nullcontext(f"{parsed.kind}:{folder / parsed.target}")
    if bundle.kind != "outside":
        return nullcontext(bundle.spec)
    if not is_package(bundle):
        return nullcontext(f"{folder / parsed.target}:{parsed.arguments}")
    top = parsed.target.split(".")[0]
    if submitting:
        return _on_path_spec(folder, bundle.spec)
    if importlib.util.find_spec(top) is not None:
        raise BundleError(f"bundle {bundle.name}: its package {top!r} has the name of a module "
                          "the grader's interpreter already finds: it could stand in for it")
    return _spec_on_path(bundle, folder)


@contextmanager
def _on_path_spec(folder: Path, spec: str):
    with _on_path(folder):
        yield spec


@contextmanager
def _spec_on_path(bundle: Bundle, folder: Path):
    with _on_path(folder):
        try:
            source = module_file(PolicySpec.parse(bundle.spec).target)
        except ValueError as exc:
            raise BundleError(f"bundle {bundle.name}: {exc}") from None
        if folder not in source.parents:
            raise BundleError(f"bundle {bundle.name}: its spec {bundle.spec} finds {source}, "
                              "not the bundle's own code")
        yield bundle.spec


def model_config(bundle: Bundle, base_url: str = PLACEHOLDER_URL,
                 api_key_env: str | None = None, timeout_s: float = 120.0) -> ModelConfig:
    """A model entry's `ModelConfig`: the bundle's settings, the operator's endpoint."""
    fields = bundle.manifest["model"]
    return ModelConfig(model=PolicySpec.parse(bundle.spec).target, base_url=base_url,
                       api_key_env=api_key_env, timeout_s=timeout_s,
                       temperature=float(fields["temperature"]),
                       max_tokens=fields["max_tokens"],
                       max_total_tokens=fields["max_total_tokens"],
                       params=tuple((k, v) for k, v in fields["params"]),
                       no_params=tuple(fields["no_params"]),
                       price_in=fields["price_in"], price_out=fields["price_out"])


def check_loads(bundle: Bundle, submitting: bool = False) -> None:
    """The bundle's policy loads in the safe form, from a scratch copy of its files, and a model
    in it was not trained for another arm than the bundle's (`trained_for.check_model`, named
    as the bundle, not as its scratch copy: the note of a model without metadata too), or a
    `BundleError` that says why (its code does not import, its model needs an unpickling
    loader, ...); `submitting` as for `located`."""
    if bundle.kind == "model":
        try:
            model_config(bundle)
        except (ValueError, TypeError) as exc:
            raise BundleError(f"bundle {bundle.name}: its model settings are refused: {exc}") \
                from None
        return
    with tempfile.TemporaryDirectory(prefix="finality-bundle-") as scratch:
        folder = Path(scratch).resolve()
        bundle.extract(folder)
        with located(bundle, folder, submitting) as spec:
            try:
                policy = make_policy(spec, sandbox=True, allow_pickle=False)
                if isinstance(policy, ExternalPolicy):
                    policy.preflight()
            except ImportError as exc:
                raise BundleError(f"bundle {bundle.name} does not load: {exc}") from None
            except Exception as exc:  # the loader's own words: a bad model, code that fails
                unsafe = "pickle" in str(exc).lower()
                raise BundleError(
                    f"bundle {bundle.name} " + ("needs an unsafe form (an unpickling loader): "
                                                if unsafe else "does not load: ")
                    + f"{type(exc).__name__}: {str(exc).replace(str(folder), POLICY_SHOWN)}"
                ) from None
            if bundle.kind in ("sb3", "onnx"):
                try:
                    check_model(folder / PolicySpec.parse(bundle.spec).target,
                                bundle.kind == "onnx", bundle.probe,
                                f"bundle {bundle.name} ({bundle.spec})")
                except ValueError as exc:
                    raise BundleError(str(exc).replace(str(folder), POLICY_SHOWN)) from None
