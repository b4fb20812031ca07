"""Wire format throughput against torch.save / torch.load, pickle and a plain memory copy.

    python benchmarks/wire.py [--repeat N] [--big-mb 40]

Two state dicts: the FedC2I paper's LeNet (2.3 MB) and a 40 MB one (ten 1M-parameter
layers). Every throughput is parameter bytes per second, so columns compare like with like.

* wire encode+sign: what a node does per part and version before the first byte can be
  written: tensor table, BLAKE3 of the body, header, Ed25519 signature. The frame is a list
  of buffers that the transport writes as they are (`wire.Frame`), so no tensor byte is
  copied; the row "+ join" adds the copy into one bytes object, for comparison.
* wire verify+decode: the whole receive path on the received bytes: framing and size limits,
  Ed25519, BLAKE3 of the body, replay window, tensor table, shape check against the model
  and the NaN/Inf scan. Arrays view the received buffer; no copy.
* memcpy: one copy of the same bytes on one thread (`numpy.copyto`) into a preallocated,
  already touched buffer: the memory-speed yardstick.

pickle / torch.load appear only as baselines on bytes this script produced itself.
"""

from __future__ import annotations

import argparse
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from timing import median_seconds
from p2pfl.wire import NodeKey, ReplayGuard, Roster, encode_body, open_message, seal_frame
from p2pfl.wire.body import digest

HEADER = dict(kind="model", sender="client-1", recipient="server", round=3, version=12, part="full",
              meta={"samples": 5000, "loss": 0.42})


def lenet_state_dict() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(), nn.Linear(192, 10),
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def big_state_dict(megabytes: float) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    per_layer = int(megabytes * 1e6 / 4 / 10)
    return {f"layer{i}.weight": torch.randn(per_layer) for i in range(10)}


def measure(state: dict[str, torch.Tensor], repeat: int) -> dict[str, tuple[float, float | None]]:
    """name -> (encode seconds, decode seconds)."""
    key = NodeKey.generate()
    roster = Roster({"client-1": key.public_hex})
    expected = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()}
    seq = iter(range(10**9))

    def wire_encode() -> Any:
        return seal_frame(key=key, seq=next(seq), body=encode_body(state), **HEADER)

    frame = wire_encode().tobytes()

    def wire_decode() -> Any:
        return open_message(frame, roster=roster, recipient="server", replay=ReplayGuard(), expected=expected)

    msg = wire_decode()
    assert all(torch.equal(msg.torch_tensors()[k], v) for k, v in state.items())

    def torch_save() -> bytes:
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    saved, pickled = torch_save(), pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    flat = torch.cat([v.reshape(-1) for v in state.values()]).numpy()
    target = flat.copy()  # allocated and touched, so the timed copies pay no page faults
    body = encode_body(state)

    def timed(fn: Callable[[], object]) -> float:
        return median_seconds(fn, repeat, warmup=2)

    return {
        "wire": (timed(wire_encode), timed(wire_decode)),
        "wire + join": (timed(lambda: wire_encode().tobytes()), None),
        "torch.save": (timed(torch_save), timed(lambda: torch.load(io.BytesIO(saved)))),
        "pickle": (timed(lambda: pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)), timed(lambda: pickle.loads(pickled))),
        "memcpy": (timed(lambda: np.copyto(target, flat)), timed(lambda: np.copyto(target, flat))),
        "blake3 only": (timed(lambda: digest(body.chunks)), None),
    }


def report(title: str, state: dict[str, torch.Tensor], repeat: int) -> None:
    param_bytes = sum(t.numel() * t.element_size() for t in state.values())
    rows = measure(state, repeat)

    def gbps(seconds: float | None) -> str:
        return "-" if seconds is None else f"{param_bytes / seconds / 1e9:.2f}"

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.2f}"

    print(f"{title}: {len(state)} tensors, {param_bytes / 1e6:.1f} MB of parameters; median of {repeat} runs")
    print(f"{'':<14}{'encode GB/s':>12}{'decode GB/s':>12}{'encode ms':>11}{'decode ms':>11}")
    for name, (enc, dec) in rows.items():
        print(f"{name:<14}{gbps(enc):>12}{gbps(dec):>12}{ms(enc):>11}{ms(dec):>11}")
    enc_w, dec_w = rows["wire"]
    save, load = rows["torch.save"]
    copy = rows["memcpy"][0]
    print(f"  ratios (throughput, >1: wire faster)   encode+sign / torch.save {save / enc_w:5.2f}   "
          f"verify+decode / torch.load {load / dec_w:5.2f}")
    print(f"                                         encode+sign / memcpy     {copy / enc_w:5.2f}   "
          f"verify+decode / memcpy     {copy / dec_w:5.2f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per measurement (median reported)")
    parser.add_argument("--big-mb", type=float, default=40.0, help="size of the large state dict in MB")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as every node runs (runtime.torch_threads = 1)
    print(f"torch {torch.__version__}, 1 torch thread; BLAKE3 uses every core when the body's buffers average >= 1 MiB")
    print()
    report("LeNet state dict", lenet_state_dict(), args.repeat)
    report(f"{args.big_mb:g} MB state dict", big_state_dict(args.big_mb), args.repeat)


if __name__ == "__main__":
    main()
