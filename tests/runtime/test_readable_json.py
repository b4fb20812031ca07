"""`dumps_readable`: the JSON documents a run writes (results.json, each node's result), a line an
item at the first two levels, encoded by `json.dumps` in C below them."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from p2pfl.runtime.files import dumps_readable, write_json_atomic

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                         max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(documents, st.integers(min_value=0, max_value=4))
def test_it_reads_back_as_the_document_json_dumps_writes(document, indent: int) -> None:
    assert json.loads(dumps_readable(document, indent)) == json.loads(json.dumps(document))


def test_a_run_s_results_are_a_node_a_line_and_keys_json_would_turn_into_strings_are_kept() -> None:
    results = {"summary": {"wall_s": 1.5}, "nodes": [{"id": "node-0", "rounds": [1, 2]}, {"id": "node-1", "rounds": []}],
               "by_round": {1: 0.5, None: 0.25}}
    text = dumps_readable(results)
    lines = text.splitlines()
    assert '  {"id": "node-0", "rounds": [1, 2]},' in lines  # one node, one line
    assert '  {"id": "node-1", "rounds": []}' in lines
    assert json.loads(text) == {"summary": {"wall_s": 1.5}, "nodes": results["nodes"], "by_round": {"1": 0.5, "null": 0.25}}


def test_written_atomically_it_is_the_readable_form(tmp_path) -> None:
    path = tmp_path / "doc.json"
    write_json_atomic(path, {"a": [1, {"b": 2}]})
    assert path.read_text() == dumps_readable({"a": [1, {"b": 2}]})
    write_json_atomic(path, {"a": [1]}, indent=None)
    assert path.read_text() == '{"a": [1]}'
