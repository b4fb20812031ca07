from __future__ import annotations

from pathlib import Path

TINY = """
name = "tiny"
nodes = {nodes}
seed = 0
rounds = {rounds}

[data]
dataset = "mnist"
partition = "iid"
samples_per_node = {samples}

[model]
name = "cnn"

[algorithm]
name = "{algorithm}"

[train]
epochs = 1
batch_size = 32

[runtime]
fetch_timeout_s = {timeout}
linger_s = 20
message_limit_mb = 4
"""


def write_tiny(tmp: Path, *, nodes: int = 3, rounds: int = 2, samples: int = 60, algorithm: str = "fedavg",
               timeout: float = 30.0) -> Path:
    path = tmp / "tiny.toml"
    path.write_text(TINY.format(nodes=nodes, rounds=rounds, samples=samples, algorithm=algorithm, timeout=timeout))
    return path
