"""Every endpoint the model policy can be given implements the one interface the policy asks of
an endpoint (`agents.model.ChatEndpoint`), checked member by member: each method defined by the
endpoint itself (not inherited from the protocol), with every parameter of the protocol's under
the same name, in the same place, of a kind and default the protocol's callers can use, and no
further parameter a caller would have to give; each attribute present. And the protocol is all
the policy asks: the policy reads nothing else of its endpoint."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import agents.model.policy
from agents.model import ChatEndpoint, Endpoint, ModelConfig

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def protocol_members(protocol) -> tuple[set[str], dict]:
    """The attributes a protocol declares and the methods it defines (name -> function)."""
    methods = {name: value for name, value in vars(protocol).items()
               if inspect.isfunction(value) and not name.startswith("_")}
    return set(protocol.__annotations__), methods


def mismatches(protocol, implementation, instance) -> list[str]:
    """What keeps `implementation` (and its `instance`) from being a `protocol`: [] if nothing."""
    attributes, methods = protocol_members(protocol)
    wrong = [f"attribute {name} missing" for name in sorted(attributes)
             if not hasattr(instance, name)]
    for name, declared in methods.items():
        defined = getattr(implementation, name, None)
        if defined is None or defined is declared or not inspect.isfunction(defined):
            wrong.append(f"{name}: not defined by {implementation.__name__}")
            continue
        wrong += [f"{name}: {problem}" for problem in
                  signature_mismatches(inspect.signature(declared), inspect.signature(defined))]
    return wrong


def signature_mismatches(declared: inspect.Signature, defined: inspect.Signature) -> list[str]:
    """Where a method with signature `defined` cannot be called as `declared` says it may be."""
    wanted, given = list(declared.parameters.values()), list(defined.parameters.values())
    names = {p.name: p for p in given}
    wrong = []
    for index, p in enumerate(wanted):
        q = names.get(p.name)
        if q is None:
            wrong.append(f"no parameter {p.name}")
            continue
        if p.kind in POSITIONAL and (q.kind != p.kind or given.index(q) != index):
            wrong.append(f"{p.name} is not positional parameter {index}")
        if p.kind == inspect.Parameter.KEYWORD_ONLY and q.kind not in (
                inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            wrong.append(f"{p.name} cannot be given by keyword")
        if p.default is not inspect.Parameter.empty and q.default != p.default:
            wrong.append(f"{p.name} defaults to {q.default!r}, not {p.default!r}")
    for q in given:
        if (q.name not in declared.parameters and q.kind not in VARIADIC
                and q.default is inspect.Parameter.empty):
            wrong.append(f"{q.name} is required but not the protocol's")
    return wrong


def test_the_http_endpoint_is_a_chat_endpoint():
    endpoint = Endpoint(ModelConfig(model="m", base_url="http://127.0.0.1:9/v1"))
    assert ChatEndpoint in Endpoint.__mro__  # declared, not only shaped alike
    assert mismatches(ChatEndpoint, Endpoint, endpoint) == []
    assert isinstance(endpoint.params, dict)


def test_inspects_endpoints_are_chat_endpoints():
    pytest.importorskip("inspect_ai", reason="the 'inspect' extra is not installed")
    from eval.models.inspect_task import InspectEndpoint, LoggedEndpoint

    for implementation, instance in ((InspectEndpoint, InspectEndpoint(None, None)),
                                     (LoggedEndpoint, LoggedEndpoint([]))):
        assert ChatEndpoint in implementation.__mro__  # declared, not only shaped alike
        assert mismatches(ChatEndpoint, implementation, instance) == []
        assert instance.params == {}


def test_the_check_refuses_what_the_policy_could_not_call():
    """The check itself fails where it should: inspect's endpoint as it was (a `retries` where
    the policy gives `room`), a required parameter the policy never gives, the protocol's own
    method inherited, and a missing attribute."""

    class Old(ChatEndpoint):
        params: dict = {}

        def complete(self, request, rng, retries=None):
            return {}, 0.0, 1, []

    class Demanding(ChatEndpoint):
        params: dict = {}

        def complete(self, request, rng, deadline, *, room=None):
            return {}, 0.0, 1, []

    class Hollow(ChatEndpoint):
        pass

    assert mismatches(ChatEndpoint, Old, Old()) == ["complete: no parameter room"]
    assert mismatches(ChatEndpoint, Demanding, Demanding()) == [
        "complete: deadline is required but not the protocol's"]
    assert mismatches(ChatEndpoint, Hollow, Hollow()) == [
        "attribute params missing", "complete: not defined by Hollow"]


def test_the_policy_asks_its_endpoint_for_nothing_but_the_protocol():
    """Every use of `self.endpoint` in the policy's source is a member of the protocol, and every
    keyword it gives `complete` a parameter of it."""
    attributes, methods = protocol_members(ChatEndpoint)
    tree = ast.parse(Path(agents.model.policy.__file__).read_text())
    used, keywords = set(), set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "endpoint"):
            used.add(node.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "complete"):
            keywords |= {k.arg for k in node.keywords}
    assert used == attributes | set(methods)
    assert keywords <= set(inspect.signature(methods["complete"]).parameters)
