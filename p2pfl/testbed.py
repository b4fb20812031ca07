"""Hosts on one Linux machine: a network namespace per host, joined by a bridge, optionally
with every link capped by a token-bucket filter (`tc qdisc ... tbf`).

Each host has its own network stack and address, so a node in one reaches a node in another
only over its link, as between machines on a LAN; a cap limits what each host sends and
receives, which makes the link, not the CPU, the bottleneck. Used by the cross-host tests
and by `benchmarks/links.py`. Needs root and iproute2 (`ip`, `tc`); `available()` says
whether this machine has them.

    with NetnsHosts(["node-0", "node-1"], rate_mbit=10) as bed:
        bed.address("node-0")                          # "198.18.0.1"
        bed.spawn("node-0", ["p2pfl", "node", "..."])  # runs inside node-0's namespace
        bed.link_down("node-1")                        # its host drops off the network

    with NetnsHosts(["a", "b"], behind_nat=["b"]) as bed:  # b reaches a; nothing reaches b
        bed.address("b")                               # its router's LAN address, which a sees

Addresses come from 198.18.0.0/15, the range set aside for network benchmarks (RFC 2544),
so they cannot clash with a real LAN. Everything the testbed makes is removed on exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

SUBNET = "198.18.{block}.{host}"  # /24 per testbed: up to 253 hosts
_created_blocks = 0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def available(nat: bool = False) -> tuple[bool, str]:
    """(True, "") if namespaces (and with `nat`, a masquerading router) can be made here, else
    (False, why not)."""
    if os.geteuid() != 0:
        return False, "needs root (network namespaces)"
    for tool in ("ip", "tc") + (("nft",) if nat else ()):
        if shutil.which(tool) is None:
            return False, f"needs `{tool}` ({'nftables' if tool == 'nft' else 'iproute2'})"
    probe = f"p2pfl-probe-{uuid.uuid4().hex[:8]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return True, ""


def tbf_args(rate_mbit: float) -> list[str]:
    """A token bucket of `rate_mbit`: a burst of 10 ms at that rate (at least 32 KiB, so that
    one full-size frame always fits) and a queue of at most 100 ms."""
    burst = max(32 * 1024, int(rate_mbit * 1e6 / 8 / 100))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", "100ms"]


class NetnsHosts:
    """Namespaces `<tag>-<i>`, one per host, each with `eth0` cabled to a bridge in `<tag>-sw`."""

    def __init__(self, hosts: Sequence[str], rate_mbit: float | None = None, behind_nat: Sequence[str] = ()) -> None:
        """`behind_nat`: hosts cabled to a router of their own (namespace `<ns>-gw`) that
        masquerades what they send and forwards nothing to them, as a home router with no port
        forwarded: they reach every host, and no host reaches them."""
        global _created_blocks
        if len(set(hosts)) != len(hosts) or not 0 < len(hosts) <= 253:
            raise ValueError(f"expected 1..253 distinct host names, got {list(hosts)}")
        if not set(behind_nat) <= set(hosts):
            raise ValueError(f"behind_nat names hosts that are not hosts: {sorted(set(behind_nat) - set(hosts))}")
        self.hosts = list(hosts)
        self.behind_nat = frozenset(behind_nat)
        self.rate_mbit = rate_mbit
        self.tag = f"p2pfl-{uuid.uuid4().hex[:6]}"
        self.block = (os.getpid() + _created_blocks) % 256  # distinct subnets for testbeds alive at once
        _created_blocks += 1
        self.switch = f"{self.tag}-sw"
        self.processes: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{self.hosts.index(host)}"

    def address(self, host: str) -> str:
        return SUBNET.format(block=self.block, host=self.hosts.index(host) + 1)

    def __enter__(self) -> NetnsHosts:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            ns = self.namespace(host)
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            on_lan = ns
            if host in self.behind_nat:
                on_lan = self._router(ns, i)
            # Both ends made directly in their namespaces: no name ever appears in this one.
            _ip("link", "add", "eth0", "netns", on_lan, "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"p{i}", "up")
            _ip("-n", on_lan, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", on_lan, "link", "set", "eth0", "up")
            if self.rate_mbit is not None:
                # A qdisc shapes what leaves an interface: eth0 caps the host's upload, the
                # bridge port its download.
                subprocess.run(["ip", "netns", "exec", on_lan, "tc", "qdisc", "add", "dev", "eth0", "root",
                                *tbf_args(self.rate_mbit)], check=True, capture_output=True)
                subprocess.run(["ip", "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", f"p{i}", "root",
                                *tbf_args(self.rate_mbit)], check=True, capture_output=True)

    def _router(self, ns: str, i: int) -> str:
        """A router namespace for the host in `ns`: the host behind it on 10.200.<i>.0/24, what it
        sends masqueraded as the router's LAN address, nothing forwarded in. Its name."""
        gw = f"{ns}-gw"
        _ip("netns", "add", gw)
        self._made.append(gw)
        _ip("-n", gw, "link", "set", "lo", "up")
        _ip("link", "add", "in0", "netns", gw, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", gw, "addr", "add", f"10.200.{i}.1/24", "dev", "in0")
        _ip("-n", gw, "link", "set", "in0", "up")
        _ip("-n", ns, "addr", "add", f"10.200.{i}.2/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "route", "add", "default", "via", f"10.200.{i}.1")
        for command in (["sysctl", "-qw", "net.ipv4.ip_forward=1"], ["nft", "add", "table", "ip", "nat"],
                        ["nft", "add", "chain", "ip", "nat", "post", "{ type nat hook postrouting priority 100 ; }"],
                        ["nft", "add", "rule", "ip", "nat", "post", "oifname", "eth0", "masquerade"]):
            subprocess.run(["ip", "netns", "exec", gw, *command], check=True, capture_output=True)
        return gw

    def spawn(self, host: str, argv: Sequence[str], *, log: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start `argv` inside `host`'s namespace; its output goes to `log` (else discarded)."""
        sink: IO[bytes] | int = open(log, "ab") if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(["ip", "netns", "exec", self.namespace(host), *argv], stdout=sink,
                                stderr=subprocess.STDOUT, env=env)
        self.processes.append(proc)
        return proc

    def private_address(self, host: str) -> str:
        """Where a host behind NAT is on its own side of the router (nobody else can reach it)."""
        if host not in self.behind_nat:
            raise ValueError(f"{host} is not behind NAT; its address is {self.address(host)}")
        return f"10.200.{self.hosts.index(host)}.2"

    def link_down(self, host: str) -> None:
        """Unplug `host`'s cable at the switch: its packets go nowhere, nothing is refused."""
        _ip("-n", self.switch, "link", "set", f"p{self.hosts.index(host)}", "down")

    def kill_host(self, host: str) -> list[int]:
        """Kill every process in `host`'s namespace at once (SIGKILL), as a machine that dies takes
        down all it runs, the daemons what was spawned there started included. Their pids."""
        listed = _ip("netns", "pids", self.namespace(host), check=False).stdout.split()
        for pid in map(int, listed):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return [int(p) for p in listed]

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for host in self.hosts:  # what a spawned process left running there (a daemon it started)
            self.kill_host(host)
        for ns in reversed(self._made):  # deleting a namespace deletes its interfaces and qdiscs
            _ip("netns", "del", ns, check=False)
        self._made.clear()
