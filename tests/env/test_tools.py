"""The tool table shown to agents agrees with the engine's own call validation."""

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.model import system_prompt
from finality_gym import TOOLS, Episode, InvalidCall, load_corpus
from finality_gym.episode import check_call
from finality_gym.tasks import CALL_BUDGET, HANDOVER_AT, HORIZON, SHIP_BY
from finality_gym.tools import TOOL_TABLE, chat_tools, tools_hash

# JSON Schema's `integer` admits 60.0; the table's documented choice is a JSON integer literal.
_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, x: type(x) is int)
Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_TYPES)
SCHEMAS = {t["name"]: Validator(t["parameters"]) for t in TOOL_TABLE}

values = st.one_of(st.integers(-5, 2000), st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from(["original", "fresh", "60", "", "ORIGINAL"]), st.booleans(),
                   st.none(), st.lists(st.integers(), max_size=2))
arg_objects = st.dictionaries(st.sampled_from(["ticks", "key", "verbose", "t"]), values,
                              max_size=3)


def test_the_table_names_every_tool_once_in_the_engines_order():
    assert tuple(t["name"] for t in TOOL_TABLE) == TOOLS
    for spec in chat_tools():
        assert spec["type"] == "function"
        jsonschema.Draft202012Validator.check_schema(spec["function"]["parameters"])
        assert len(spec["function"]["description"]) > 20


def _engine_accepts(tool, args) -> bool:
    try:
        check_call(tool, args)
    except InvalidCall:
        return False
    return True


@given(tool=st.sampled_from(TOOLS), args=arg_objects)
def test_schema_and_engine_accept_exactly_the_same_arguments(tool, args):
    assert SCHEMAS[tool].is_valid(args) == _engine_accepts(tool, args), (tool, args)


@pytest.mark.parametrize("tool,args,valid", [
    ("wait", {"ticks": 60}, True), ("wait", {"ticks": 60.0}, False),
    ("wait", {"ticks": "60"}, False), ("wait", {}, False), ("wait", {"ticks": 0}, False),
    ("wait", {"ticks": True}, False), ("retry_capture", {"key": "original"}, True),
    ("retry_capture", {"key": "fresh"}, True), ("retry_capture", {"key": "new"}, False),
    ("retry_capture", {}, False), ("ship", {}, True), ("ship", {"now": 1}, False),
    ("read_ledger", {}, True),
])
def test_the_forms_models_really_emit(tool, args, valid):
    assert SCHEMAS[tool].is_valid(args) is valid
    assert _engine_accepts(tool, args) is valid


@given(tool=st.sampled_from(TOOLS), args=arg_objects)
def test_a_call_the_schema_rejects_changes_nothing_in_the_world(tool, args):
    if SCHEMAS[tool].is_valid(args):
        return
    episode = Episode(load_corpus("public").tasks[3], seed=1)
    episode.call("read_processor")
    before = (episode.now, episode.calls_used, len(episode.world.log), list(episode.history))
    with pytest.raises(InvalidCall):
        episode.call(tool, **args)
    assert (episode.now, episode.calls_used, len(episode.world.log),
            list(episode.history)) == before


def test_unknown_tools_are_rejected_by_both():
    assert "read_everything" not in SCHEMAS
    assert not _engine_accepts("read_everything", {})


def test_tools_hash_changes_with_the_table(monkeypatch):
    before = tools_hash()
    changed = (dict(TOOL_TABLE[0], description="something else"),) + TOOL_TABLE[1:]
    monkeypatch.setattr("finality_gym.tools.TOOL_TABLE", changed)
    assert tools_hash() != before


def test_the_system_prompt_states_the_rules_and_prefers_no_tool():
    prompt = system_prompt()
    for value in (HANDOVER_AT, SHIP_BY, HORIZON, CALL_BUDGET, 2500, 1800, "60%"):
        assert str(value) in prompt
    assert "{" not in prompt  # every placeholder filled
    lowered = prompt.lower()
    for hint in ("probe", "wait", "read_", "retry_capture", "prefer", "authoritative",
                 "finality"):
        assert hint not in lowered, hint
