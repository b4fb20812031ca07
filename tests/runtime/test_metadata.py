"""Property tests of the metadata schema: any JSON-like value is either valid by the declared
type and range, or rejected as BadMetadata naming the field; nothing else ever escapes."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from p2pfl.runtime.metadata import GLOBAL_META, MODEL_META, STATS_META, BadMetadata, MetaField, check_meta
from p2pfl.wire.header import is_json_like

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=50),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)


def valid_by_hand(field: MetaField, value: Any) -> bool:
    """The schema restated without its code: what a value of each kind must be."""
    if value is None:
        return field.nullable
    if field.kind == "bool":
        return isinstance(value, bool)
    if field.kind in ("int", "float"):
        kinds = (int,) if field.kind == "int" else (int, float)
        return (not isinstance(value, bool) and isinstance(value, kinds) and math.isfinite(value)
                and (field.minimum is None or value >= field.minimum)
                and (field.maximum is None or value <= field.maximum))
    if field.kind == "str":
        return isinstance(value, str) and len(value) <= field.max_length
    return (isinstance(value, dict) and len(value) <= field.max_length
            and all(isinstance(k, str) and (field.values is None or valid_by_hand(field.values, v)) for k, v in value.items()))


@settings(max_examples=400, deadline=None)
@given(value=json_values)
def test_n_train_is_accepted_exactly_when_it_is_a_positive_bounded_integer(value: Any) -> None:
    field = MODEL_META["n_train"]
    try:
        check_meta({"n_train": value}, MODEL_META)
    except BadMetadata as exc:
        assert not valid_by_hand(field, value)
        assert exc.field == "n_train" and exc.status == 422 and str(exc).startswith("meta.n_train")
    else:
        assert valid_by_hand(field, value)


@settings(max_examples=400, deadline=None)
@given(meta=st.dictionaries(st.sampled_from(sorted(STATS_META) + ["unknown"]), json_values, max_size=8))
def test_stats_metadata_is_valid_iff_every_declared_field_is(meta: dict[str, Any]) -> None:
    expected_ok = all(
        (name in meta and valid_by_hand(field, meta[name])) or (name not in meta and not field.required)
        for name, field in STATS_META.items()
    )
    try:
        check_meta(meta, STATS_META)
    except BadMetadata as exc:
        assert not expected_ok
        assert exc.field in STATS_META
    else:
        assert expected_ok


@settings(max_examples=200, deadline=None)
@given(weights=st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_global_weights_must_be_a_map_of_finite_numbers(weights: dict[str, Any]) -> None:
    ok = all(valid_by_hand(GLOBAL_META["weights"].values, v) for v in weights.values())  # type: ignore[arg-type]
    try:
        check_meta({"weights": weights}, GLOBAL_META)
    except BadMetadata as exc:
        assert not ok and exc.field.startswith("weights")
    else:
        assert ok


@given(value=json_values)
def test_every_generated_value_is_one_the_wire_can_carry(value: Any) -> None:
    assert is_json_like({"v": value})  # so the properties above cover what a header may hold
