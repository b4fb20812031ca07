"""Wire format throughput vs pickle and torch.save on a LeNet-sized state dict.

    python benchmarks/wire.py [--repeat N]

Throughput is parameter bytes per second for every format, so the columns compare like
with like. pickle/torch.load appear only as baselines on bytes this script produced itself.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import pickle
from typing import Any

import torch
from torch import nn

from timing import median_seconds
from p2pfl.wire import NodeKey, ReplayGuard, Roster, encode, encode_body, open_message, seal


def lenet_state_dict() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(1024, 384),
        nn.ReLU(),
        nn.Linear(384, 192),
        nn.ReLU(),
        nn.Linear(192, 10),
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per measurement (median reported)")
    args = parser.parse_args()

    state = lenet_state_dict()
    param_bytes = sum(t.numel() * t.element_size() for t in state.values())
    n_params = sum(t.numel() for t in state.values())
    key = NodeKey.generate()
    roster = Roster({"client-1": key.public_hex})
    expected = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()}
    header = dict(kind="model", sender="client-1", recipient="server", round=3, version=12, part="full",
                  meta={"samples": 5000, "loss": 0.42})

    seq = iter(range(10**9))

    def wire_encode() -> bytes:
        return encode(key=key, seq=next(seq), tensors=state, **header)

    frame = wire_encode()
    body = encode_body(state)

    def wire_seal() -> bytes:
        return seal(key=key, seq=next(seq), body=body, **header)

    def wire_decode() -> Any:
        # Full receive path: size/framing, Ed25519 verify, body sha256, replay window,
        # shape check against the model and the NaN/Inf scan.
        return open_message(frame, roster=roster, recipient="server", replay=ReplayGuard(), expected=expected)

    def torch_save() -> bytes:
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    pickled = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    saved = torch_save()
    msg = wire_decode()
    assert all(torch.equal(msg.torch_tensors()[k], v) for k, v in state.items())

    rows = {
        "wire": (len(frame), median_seconds(wire_encode, args.repeat, warmup=2), median_seconds(wire_decode, args.repeat, warmup=2)),
        "pickle": (
            len(pickled),
            median_seconds(lambda: pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), args.repeat, warmup=2),
            median_seconds(lambda: pickle.loads(pickled), args.repeat, warmup=2),
        ),
        "torch.save": (
            len(saved),
            median_seconds(torch_save, args.repeat, warmup=2),
            median_seconds(lambda: torch.load(io.BytesIO(saved)), args.repeat, warmup=2),
        ),
    }
    seal_s = median_seconds(wire_seal, args.repeat, warmup=2)
    # The integrity digest is the floor under both wire directions; the baselines have none.
    sha_s = median_seconds(lambda: hashlib.sha256(body.data).digest(), args.repeat, warmup=2)

    def mbps(seconds: float) -> float:
        return param_bytes / seconds / 1e6

    print(f"LeNet state dict: {len(state)} tensors, {n_params:,} params, {param_bytes:,} parameter bytes; "
          f"median of {args.repeat} runs; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"wire frame: {msg.meta_bytes} metadata bytes on top of the parameters")
    print()
    print(f"{'format':<12}{'size (B)':>12}{'encode MB/s':>14}{'decode MB/s':>14}{'encode ms':>12}{'decode ms':>12}")
    for name, (size, enc, dec) in rows.items():
        print(f"{name:<12}{size:>12,}{mbps(enc):>14.0f}{mbps(dec):>14.0f}{enc * 1e3:>12.2f}{dec * 1e3:>12.2f}")
    print(f"{'wire seal':<12}{len(frame):>12,}{mbps(seal_s):>14.0f}{'-':>14}{seal_s * 1e3:>12.2f}{'-':>12}"
          "   (body encoded once, sealed per response)")
    print(f"sha256 of the body alone: {sha_s * 1e3:.2f} ms ({mbps(sha_s):.0f} MB/s), paid once by encode and once by decode")
    print()
    size_w, enc_w, dec_w = rows["wire"]
    print("ratios wire/baseline (throughput; >1 means wire is faster; size <1 means wire is smaller)")
    print(f"{'baseline':<12}{'encode':>10}{'decode':>10}{'size':>10}")
    for name in ("pickle", "torch.save"):
        size_b, enc_b, dec_b = rows[name]
        print(f"{name:<12}{enc_b / enc_w:>10.2f}{dec_b / dec_w:>10.2f}{size_w / size_b:>10.3f}")


if __name__ == "__main__":
    main()
