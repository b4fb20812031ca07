"""The commands of a LAN deployment: `lan` (one admin's shortcut: every key, the roster and each
node's config), `keygen` (a host's own key and roster entry) and `roster check`."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from p2pfl.commands.options import add_set
from p2pfl.errors import ConfigError

NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # what a key file may be named after


def add(sub: Any) -> None:
    lan = sub.add_parser("lan", help="one admin's shortcut: every key, the roster and each node's config for a LAN")
    lan.add_argument("scenario", type=Path)
    lan.add_argument("--hosts", required=True, help="comma-separated host:port, one per node, in node order")
    lan.add_argument("--coordinator", default=None, help="host:port of the coordinator, for DI/GA")
    lan.add_argument("--out", type=Path, required=True)
    lan.add_argument("--force", action="store_true", help="replace the keys and configs already in --out (every host "
                                                          "then needs its new key)")
    add_set(lan)
    lan.set_defaults(handler=_lan)

    keygen = sub.add_parser("keygen", help="make this host's private key and print its roster entry")
    keygen.add_argument("node_id", help='the node\'s id as the roster will list it (or "coordinator")')
    keygen.add_argument("--out", type=Path, required=True, help="folder for <node_id>.key (created, mode 0600)")
    keygen.add_argument("--url", default=None, help="how peers reach this node, e.g. http://192.0.2.10:9000")
    keygen.add_argument("--tls", action="store_true", help="add the certificate fingerprint (runtime.tls = true)")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")
    keygen.add_argument("--federation", action="store_true",
                        help="for a federation's member: no roster entry, the .pub file goes to the operator")
    keygen.set_defaults(handler=_keygen)

    roster = sub.add_parser("roster", help="the shared roster of a LAN deployment")
    roster_sub = roster.add_subparsers(dest="roster_command", required=True)
    check = roster_sub.add_parser("check", help="validate a roster and probe every host it lists")
    check.add_argument("roster", type=Path)
    check.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each host (default 3)")
    check.add_argument("--no-probe", action="store_true", help="validate the file only")
    check.set_defaults(handler=_roster_check)


def _lan(args: argparse.Namespace) -> int:
    from p2pfl.scenario.launcher import write_lan_configs

    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    paths = write_lan_configs(args.scenario, hosts, args.out, args.coordinator, args.overrides, force=args.force)
    print(f"roster: {args.out / 'roster.toml'} (check it with: p2pfl roster check {args.out / 'roster.toml'})")
    for path in paths:
        print(f"p2pfl {'coordinator' if path.stem == 'coordinator' else 'node'} {path}")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from p2pfl.runtime.peers import COORDINATOR_ID, PeerInfo, parse_peer
    from p2pfl.runtime.roster import entry_toml
    from p2pfl.runtime.tls import fingerprint
    from p2pfl.runtime.transport.addresses import HTTP
    from p2pfl.wire import NodeKey

    if not NODE_ID.fullmatch(args.node_id):
        raise ConfigError("node_id", f"{args.node_id!r} is not a node id: letters, digits, '.', '_' and '-', "
                                     "starting with a letter or digit (it names the key file inside --out)")
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError("--out", f"{args.out} is a file; name the folder the key goes into")
    path = args.out / f"{args.node_id}.key"
    if path.exists() and not args.force:
        raise ConfigError("--out", f"{path} exists; a new key would orphan the roster's entry (pass --force to replace it)")
    args.out.mkdir(parents=True, exist_ok=True)
    key = NodeKey.generate()
    url = args.url or HTTP.format("HOST", "PORT", tls=args.tls)  # a LAN's nodes are reached over HTTP
    if args.url is not None:
        parse_peer({"url": url, "public_key": key.public_hex}, "--url")
    key.save(path)
    path.with_suffix(".pub").write_text(key.public_hex + "\n")  # for `p2pfl federation admit`
    print(f"# private key: {path} (mode 600; it never leaves this host); public key: {path.with_suffix('.pub')}",
          file=sys.stderr)
    if args.federation:  # admission is by certificate: nobody keeps a roster
        print(f"give {path.with_suffix('.pub')} to the federation's operator: p2pfl federation admit "
              f"{path.with_suffix('.pub')} --id {args.node_id} --dir FED --out {args.node_id}.cert")
        return 0
    info = PeerInfo(url, key.public_hex, fingerprint(key, args.node_id) if args.tls else None)
    if args.url is None:
        print("# replace HOST:PORT with the address peers reach this host at", file=sys.stderr)
    if args.node_id == COORDINATOR_ID:
        import tomli_w

        print("[coordinator]\n" + tomli_w.dumps(info.to_dict()), end="")
    else:
        print(entry_toml(args.node_id, info), end="")
    return 0


def _roster_check(args: argparse.Namespace) -> int:
    from p2pfl.runtime.roster import load_roster, probe_roster

    roster = load_roster(args.roster)
    extra = " and a coordinator" if roster.coordinator is not None else ""
    print(f"{args.roster}: {len(roster.nodes)} nodes{extra}; ids, addresses and keys are valid and distinct")
    if args.no_probe:
        return 0
    probes = probe_roster(roster, args.timeout)
    width = max(len(p.id) for p in probes)
    for p in probes:
        state = "ok" if p.reachable else "UNREACHABLE"
        print(f"  {p.id:<{width}}  {p.url:<32} {state:<11} {p.detail} ({p.seconds * 1000:.0f} ms)")
    down = [p.id for p in probes if not p.reachable]
    if down:
        print(f"{len(down)} of {len(probes)} hosts unreachable: {', '.join(down)} "
              "(not started yet, a firewall, or a wrong address)", file=sys.stderr)
        return 1
    return 0
