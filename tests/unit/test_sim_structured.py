"""The simulator's structured answers (llmgw/engines/sim/structured.py): a JSON instance of any schema of the
kinds tools and response_format use is valid against it (Hypothesis, checked by a JSON Schema validator),
the same each time; stop strings cut where the first one starts; tool choice as OpenAI describes it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.engines.sim.structured import cut, instance, legacy_logprobs, pieces, token_logprobs, tool_calls
from llmgw.errors import OpenAIError

_names = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
_leaves = st.one_of(
    st.just({"type": "string"}),
    st.builds(lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra},
              st.integers(0, 12), st.integers(0, 5)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda lo, extra, kind: {"type": kind, "minimum": lo, "maximum": lo + extra},
              st.integers(-50, 50), st.integers(0, 10), st.sampled_from(["integer", "number"])),
    st.builds(lambda lo: {"type": "integer", "exclusiveMinimum": lo}, st.integers(-5, 5)),
    st.lists(st.one_of(st.integers(), st.text(max_size=4), st.booleans()), min_size=1, max_size=4, unique=True)
    .map(lambda values: {"enum": values}),
    st.just({"const": "fixed"}),
)


def _compound(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    objects = st.dictionaries(_names, children, max_size=4).flatmap(
        lambda props: st.builds(lambda req: {"type": "object", "properties": props, "required": req,
                                             "additionalProperties": False},
                                st.lists(st.sampled_from(sorted(props)), unique=True) if props else st.just([])))
    arrays = st.builds(lambda items, lo: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + 2},
                       children, st.integers(0, 3))
    optional = children.map(lambda c: {"anyOf": [c, {"type": "null"}]})
    return st.one_of(objects, arrays, optional)


SCHEMAS = st.recursive(_leaves, _compound, max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(schema=SCHEMAS, seed=st.text(max_size=8))
def test_an_instance_is_valid_against_its_schema_and_the_same_each_time(schema: dict[str, Any], seed: str) -> None:
    value = instance(schema, seed)
    assert jsonschema_rs.Draft202012Validator(schema).is_valid(value), (schema, value)
    assert instance(schema, seed) == value
    json.dumps(value)  # JSON, whatever the schema


def test_refs_to_defs_as_pydantic_writes_them() -> None:
    schema = {"$defs": {"City": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                        "Node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/Node"},
                                                                                     {"type": "null"}]}}}},
              "type": "object", "properties": {"city": {"$ref": "#/$defs/City"}, "chain": {"$ref": "#/$defs/Node"}},
              "required": ["city", "chain"]}
    value = instance(schema)
    assert jsonschema_rs.Draft202012Validator(schema).is_valid(value)  # the recursion ends
    assert isinstance(value["city"]["name"], str)


@pytest.mark.parametrize(("stops", "expected"), [(["c"], "ab "), (["bc", "b"], "a"), (["zz"], None), ([], None),
                                                 (["a"], ""), ([" d"], "ab c")])
def test_stop_strings_cut_where_the_first_starts(stops: list[str], expected: str | None) -> None:
    found = cut(pieces("ab c d"), stops)
    assert (None if found is None else "".join(found[0])) == expected


def test_tool_choice_as_openai_describes_it() -> None:
    tools = [{"type": "function", "function": {"name": "alpha"}},
             {"type": "function", "function": {"name": "beta", "parameters": {
                 "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]

    def names(text: str, **extra: Any) -> list[str]:
        return [c.name for c in tool_calls({"tools": tools, **extra}, text)]

    assert names("nothing named") == [] and names("use beta") == ["beta"]
    assert names("alpha then beta") == ["alpha", "beta"]
    assert names("alpha then beta", parallel_tool_calls=False) == ["alpha"]
    assert names("nothing named", tool_choice="required") == ["alpha"]
    assert names("alpha", tool_choice={"type": "function", "function": {"name": "beta"}}) == ["beta"]
    assert names("alpha", tool_choice="none") == []
    assert isinstance(json.loads(tool_calls({"tools": tools}, "beta")[0].arguments)["x"], int)
    with pytest.raises(OpenAIError) as caught:
        tool_calls({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "gamma"}}}, "")
    assert caught.value.param == "tool_choice"


def test_logprobs_are_stable_and_ordered() -> None:
    tokens = pieces("the sim says this")
    content = token_logprobs(tokens, 0, 3)
    assert [e["token"] for e in content] == tokens and content == token_logprobs(tokens, 0, 3)
    for entry in content:
        ranked = [t["logprob"] for t in entry["top_logprobs"]]
        assert ranked == sorted(ranked, reverse=True) and ranked[0] == entry["logprob"] < 0
    legacy = legacy_logprobs(tokens, 0, 5, 2)
    assert legacy["text_offset"][0] == 5 and legacy["tokens"] == tokens
    assert all(len(top) == 2 and t in top for top, t in zip(legacy["top_logprobs"], tokens))
