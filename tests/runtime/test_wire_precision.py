"""runtime.wire_precision: quantised transfer of shared parameters, checked against the model's
own tensors, through the real wire codec, and in a run of node objects over HTTP."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from p2pfl.errors import ConfigError
from p2pfl.models import build_model, part_state
from p2pfl.runtime.precision import INT8_LEVELS, SCALE_SUFFIX, dequantize, quantize, wire_spec
from p2pfl.scenario.schema import load_scenario
from p2pfl.wire.errors import NonFiniteValues, ShapeMismatch

from .helpers import build_in_process, run_in_process, through_wire, write_tiny


def _model_state() -> tuple[dict[str, torch.Tensor], dict]:
    """The small CNN's tensors plus a BatchNorm's, whose integer counter must travel untouched."""
    torch.manual_seed(0)
    model = build_model("cnn", 1, 28, 10)
    norm = torch.nn.BatchNorm1d(8)
    norm(torch.randn(16, 8))
    state = {**part_state(model, "full"), **{f"norm.{k}": v for k, v in norm.state_dict().items()}}
    state = {k: v.detach().clone() for k, v in state.items()}
    return state, {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()}


@pytest.mark.parametrize("precision", ["float32", "float16", "int8"])
def test_quantised_part_passes_the_wire_checks_and_comes_back_in_the_model_dtypes(precision: str) -> None:
    state, spec = _model_state()
    received = dequantize(through_wire(quantize(state, precision), wire_spec(spec, precision)), spec, precision)
    assert set(received) == set(state)
    for name, original in state.items():
        back = received[name]
        assert back.dtype == original.dtype and back.shape == original.shape, name
        if not original.is_floating_point():
            assert torch.equal(back, original), name
        elif precision == "float32":
            assert torch.equal(back, original), name
        elif precision == "float16":
            assert torch.equal(back, original.half().float()), name
        else:  # round to the nearest of 255 levels: off by at most half a step
            step = original.abs().max() / INT8_LEVELS
            assert (back - original).abs().max() <= step / 2 * (1 + 1e-6) + 1e-12, name


@pytest.mark.parametrize("precision,ratio", [("float16", 2), ("int8", 4)])
def test_bytes_on_the_wire_shrink_by_the_dtype_ratio(precision: str, ratio: int) -> None:
    state, _ = _model_state()
    full = sum(t.numel() * t.element_size() for t in state.values() if t.is_floating_point())
    sent = quantize(state, precision)
    quantised = sum(t.numel() * t.element_size() for n, t in sent.items()
                    if n in state and state[n].is_floating_point())
    assert quantised * ratio == full
    scales = [n for n in sent if n.endswith(SCALE_SUFFIX)]
    assert len(scales) == (sum(t.is_floating_point() for t in state.values()) if precision == "int8" else 0)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.integers(1, 40), elements=st.floats(-1e4, 1e4, width=32)))
def test_int8_error_is_at_most_half_a_step_and_zero_stays_zero(values: np.ndarray) -> None:
    x = torch.from_numpy(values.copy())
    spec = {"w": (tuple(x.shape), "float32")}
    back = dequantize(quantize({"w": x}, "int8"), spec, "int8")["w"]
    step = float(x.abs().max()) / INT8_LEVELS
    assert float((back - x).abs().max()) <= step / 2 * (1 + 1e-5) + 1e-30
    assert torch.equal(back[x == 0], torch.zeros_like(back[x == 0]))


def test_an_all_zero_tensor_has_scale_zero_and_decodes_to_zeros() -> None:
    sent = quantize({"w": torch.zeros(5)}, "int8")
    assert float(sent["w" + SCALE_SUFFIX]) == 0.0
    assert torch.equal(dequantize(sent, {"w": ((5,), "float32")}, "int8")["w"], torch.zeros(5))


def test_half_precision_overflow_is_refused_as_non_finite() -> None:
    state, spec = _model_state()
    name = next(n for n, t in state.items() if t.is_floating_point())
    state[name] = state[name] + 1e6  # beyond float16's 65504: Inf on the wire
    with pytest.raises(NonFiniteValues):
        through_wire(quantize(state, "float16"), wire_spec(spec, "float16"))


def test_a_full_precision_part_is_refused_where_int8_is_expected() -> None:
    state, spec = _model_state()
    with pytest.raises(ShapeMismatch):
        through_wire(state, wire_spec(spec, "int8"))


def test_unknown_precision_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="runtime.wire_precision"):
        load_scenario(write_tiny(tmp_path), ['runtime.wire_precision="int4"'])


@pytest.mark.slow
def test_an_int8_fedavg_run_moves_a_quarter_of_the_parameter_bytes(tmp_path) -> None:
    """Three FedAvg nodes over HTTP at float32 and int8: a quarter of the parameter bytes, and
    the aggregate is the mean of the dequantised parts (so within a step of float32's)."""
    received = {}
    for precision in ("float32", "int8"):
        nodes, _ = build_in_process(write_tiny(tmp_path, nodes=3, rounds=1), tmp_path / precision,
                                    (f'runtime.wire_precision="{precision}"',))
        results, _, _ = run_in_process(nodes, None)
        assert all(r["status"] == "ok" for r in results), [r.get("error") for r in results]
        received[precision] = [r["rounds"][0]["param_bytes_received"] for r in results]
        assert all(len(r["rounds"][0]["arrived"]) == 2 for r in results)
    state = part_state(nodes[0].model, "full")
    floats = sum(t.numel() for t in state.values() if t.is_floating_point())
    scales = 4 * sum(t.is_floating_point() for t in state.values())
    others = sum(t.numel() * t.element_size() for t in state.values() if not t.is_floating_point())
    assert received["float32"] == [2 * (4 * floats + others)] * 3  # two peers' parts, 4 bytes a parameter
    assert received["int8"] == [2 * (floats + scales + others)] * 3  # 1 byte a parameter, one scale a tensor
