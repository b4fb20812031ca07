"""Pooling on the CPU: torch's NCHW max-pool kernel against the maximum of the four strided views
(`p2pfl.models.MaxPool2`, what the built-in CNN and LeNet score with), and what it changes in a
CNN's scoring pass and training step. One thread, CPU time per call.

    python benchmarks/pooling.py [--batch 24] [--repeat 200]

Printed: the pooling of a BATCHx16x28x28 activation three ways (torch's kernel on the default
layout, on channels-last, and the strided maxima; the median of rounds of 20 calls, taking turns), whether the maxima equal the kernel's values
bit for bit, and the built-in CNN's forward without gradients and its training step (forward,
backward) with `nn.MaxPool2d(2)` and with `MaxPool2`, and with the whole model channels-last
(whether its logits are bitwise those of the default layout).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from p2pfl.models import MaxPool2, build_model


def cpu_ms(*calls: Callable[[], object], repeat: int) -> list[float]:
    """Each call's median CPU ms over `repeat` rounds of 20 calls, the calls taking turns: a drift
    in the machine's speed moves them all."""
    for call in calls:
        for _ in range(5):
            call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeat):
        for call, out in zip(calls, times):
            start = time.thread_time()
            for _ in range(20):
                call()
            out.append((time.thread_time() - start) / 20 * 1e3)
    return [statistics.median(t) for t in times]


def with_torch_pooling(model: nn.Module) -> nn.Module:
    copied = copy.deepcopy(model)
    for name, module in copied.body.named_children():
        if isinstance(module, MaxPool2):
            copied.body.register_module(name, nn.MaxPool2d(2))
    return copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=30, help="rounds of 20 calls each")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.relu(torch.randn(args.batch, 16, 28, 28))
    last = x.contiguous(memory_format=torch.channels_last)
    pool = MaxPool2()
    with torch.no_grad():
        same = torch.equal(pool(x), F.max_pool2d(x, 2))
        kernel, kernel_last, maxima = cpu_ms(lambda: F.max_pool2d(x, 2), lambda: F.max_pool2d(last, 2),
                                             lambda: pool(x), repeat=args.repeat)
    print(f"pooling a {args.batch}x16x28x28 activation, median ms of CPU a call (one thread):")
    print(f"  torch's kernel, default layout  {kernel:7.3f}")
    print(f"  torch's kernel, channels-last   {kernel_last:7.3f}")
    print(f"  maxima of the strided views     {maxima:7.3f}   bitwise the kernel's values: {same}")
    model = build_model("cnn", 1, 28, 10)
    reference = with_torch_pooling(model)
    channels_last = copy.deepcopy(reference).to(memory_format=torch.channels_last)
    images = torch.rand(args.batch, 1, 28, 28)
    labels = torch.randint(0, 10, (args.batch,))
    images_last = images.contiguous(memory_format=torch.channels_last)

    def step(m: nn.Module, inputs: torch.Tensor) -> None:
        m.zero_grad()
        F.cross_entropy(m(inputs), labels).backward()

    with torch.no_grad():
        bitwise = torch.equal(model(images), reference(images))
        bitwise_last = torch.equal(channels_last(images_last), reference(images))
        scores = cpu_ms(lambda: reference(images), lambda: model(images), lambda: channels_last(images_last),
                        repeat=args.repeat)
    steps = cpu_ms(lambda: step(reference, images), lambda: step(model, images),
                   lambda: step(channels_last, images_last), repeat=args.repeat)
    print(f"the CNN on {args.batch} images, median ms of CPU:   nn.MaxPool2d   MaxPool2   channels-last model")
    for name, (a, b, c) in (("scoring (no gradients)", scores), ("a training step", steps)):
        print(f"  {name:<32}{a:12.3f} {b:10.3f} {c:21.3f}")
    print(f"logits bitwise those of nn.MaxPool2d: MaxPool2 {bitwise}, channels-last model {bitwise_last}")


if __name__ == "__main__":
    main()
