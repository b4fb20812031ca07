"""What the operator does, from one host: `p2pfl federation init / admit / revoke / status`.

    p2pfl federation init --dir fed                         # fed/federation.key (600), fed/federation.pub
    p2pfl federation admit alpha.pub --id alpha --dir fed [--expires-days 30] [--out alpha.cert]
    p2pfl federation revoke alpha --dir fed --tell http://192.0.2.10:9000
    p2pfl federation status http://192.0.2.10:9000          # the members a node sees, with their rounds

The federation key signs; it never leaves the operator's host. Certificates and revocation lists
are public: they are handed to hosts (a certificate) or told to any member (a revocation list),
which passes them on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from p2pfl.errors import ConfigError

if TYPE_CHECKING:
    from p2pfl.runtime.federation.certificates import Revocations
    from p2pfl.wire import NodeKey

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KEY_FILE, PUBLIC_FILE, REVOCATIONS_FILE = "federation.key", "federation.pub", "revocations.toml"


def add(sub: Any) -> None:
    fed = sub.add_parser("federation", help="a LAN federation that grows from one address: certificates, revocations")
    fed_sub = fed.add_subparsers(dest="federation_command", required=True)
    init = fed_sub.add_parser("init", help="make the federation key (on the operator's host only)")
    init.add_argument("--dir", type=Path, required=True, help="folder for federation.key (mode 600) and federation.pub")
    init.add_argument("--force", action="store_true", help="replace an existing federation key (every certificate dies)")
    admit = fed_sub.add_parser("admit", help="sign a membership certificate for a node's public key")
    admit.add_argument("public_key", help="the node's public key: its .pub file (p2pfl keygen writes it) or 64 hex")
    admit.add_argument("--id", required=True, dest="member", help="the node's id")
    admit.add_argument("--dir", type=Path, required=True, help="the folder of `federation init`")
    admit.add_argument("--expires-days", type=float, default=None, help="valid this many days (default: until revoked)")
    admit.add_argument("--out", type=Path, default=None, help="where the certificate goes (default: <dir>/<id>.cert)")
    rev = fed_sub.add_parser("revoke", help="take a member out: sign a new revocation list")
    rev.add_argument("member")
    rev.add_argument("--dir", type=Path, required=True)
    rev.add_argument("--tell", action="append", default=[], help="a member's address to hand the list to (it spreads "
                                                                 "from there); repeat for more")
    status = fed_sub.add_parser("status", help="the members a node sees, with their rounds")
    status.add_argument("seed", help="a member's address, e.g. http://192.0.2.10:9000")
    status.add_argument("--timeout", type=float, default=3.0)
    fed.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """The command `args` names. Its modules are imported here, not with the parser: `p2pfl --help`
    and the launcher do not load aiohttp."""
    command = args.federation_command
    if command == "init":
        return _init(args.dir, args.force)
    if command == "admit":
        return _admit(args)
    if command == "revoke":
        return _revoke(args)
    return asyncio.run(_status(args.seed.rstrip("/"), args.timeout))


def _federation_key(folder: Path) -> NodeKey:
    from p2pfl.wire import NodeKey

    path = folder / KEY_FILE
    if not path.is_file():
        raise ConfigError("--dir", f"{path} not found (make it with: p2pfl federation init --dir {folder})")
    try:
        return NodeKey.load(path)
    except ValueError as exc:
        raise ConfigError("--dir", str(exc)) from None


def _init(folder: Path, force: bool) -> int:
    from p2pfl.wire import NodeKey

    path = folder / KEY_FILE
    if path.exists() and not force:
        raise ConfigError("--dir", f"{path} exists; a new federation key would void every certificate (--force)")
    folder.mkdir(parents=True, exist_ok=True)
    key = NodeKey.generate()
    key.save(path)
    (folder / PUBLIC_FILE).write_text(key.public_hex + "\n")
    print(f"federation key: {path} (mode 600; keep it on this host)\npublic key: {folder / PUBLIC_FILE} "
          f"(give it to every host: [federation] public_key)")
    return 0


def _admit(args: argparse.Namespace) -> int:
    from p2pfl.runtime.federation.certificates import Refused, issue
    from p2pfl.runtime.federation.config import read_public_key

    key = _federation_key(args.dir)
    public = read_public_key(args.public_key, Path.cwd(), "public_key")
    now = time.time()
    if args.expires_days is not None and not args.expires_days > 0:
        raise ConfigError("--expires-days", f"expected a positive number of days, got {args.expires_days}")
    expires = None if args.expires_days is None else now + args.expires_days * 86400
    try:
        certificate = issue(key, args.member, public, now=now, expires=expires)
    except Refused as refused:
        raise ConfigError("--id", refused.detail) from None
    out = args.out or args.dir / f"{args.member}.cert"
    certificate.save(out)
    until = "until revoked" if expires is None else time.strftime("until %Y-%m-%d %H:%M UTC", time.gmtime(expires))
    print(f"{out}: {args.member} admitted ({public[:16]}...), {until}; give it to that host ([federation] certificate)")
    return 0


def load_revocations(folder: Path) -> Revocations | None:
    from p2pfl.runtime.federation.certificates import Refused, Revocations

    path = folder / REVOCATIONS_FILE
    if not path.is_file():
        return None
    try:
        return Revocations.from_dict(tomllib.loads(path.read_text()))
    except (Refused, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("--dir", f"{path}: {exc}") from None


def _revoke(args: argparse.Namespace) -> int:
    from p2pfl.runtime.federation.certificates import revoke

    key = _federation_key(args.dir)
    revocations = revoke(key, load_revocations(args.dir), args.member, now=time.time())
    (args.dir / REVOCATIONS_FILE).write_text(tomli_w.dumps(revocations.to_dict()))
    print(f"{args.dir / REVOCATIONS_FILE}: {args.member} revoked ({len(revocations.revoked)} in the list)")
    told = asyncio.run(tell(args.tell, revocations)) if args.tell else {}
    for url, answer in told.items():
        print(f"  {url}: {answer}")
    if not args.tell:
        print("  tell a member (--tell URL) or the members learn it only from one that was told")
    return 0 if not told or any(a == "taken" for a in told.values()) else 1


async def tell(urls: list[str], revocations: Revocations, timeout_s: float = 5.0) -> dict[str, str]:
    """Hand `revocations` to each member at `urls`: url -> "taken" or what it answered."""
    import aiohttp

    from p2pfl.runtime.federation.gossip import PATH, encode

    body = encode({"revocations": revocations.to_dict()})

    async def one(session: Any, url: str) -> str:
        answer = await _request(session, "POST", url.rstrip("/") + PATH, timeout_s, body)
        if isinstance(answer, str):
            return answer
        return "taken" if answer[0] == 200 else f"{answer[0]} {answer[1][:200].decode(errors='replace')}"

    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(one(session, u) for u in urls))
    return dict(zip(urls, answers))


async def _request(session: Any, method: str, url: str, timeout_s: float,
                   body: bytes | None = None) -> tuple[int, bytes] | str:
    """(status, body) of one request to a member (unpinned TLS: what it answers is signed, or
    public), or what went wrong, in words."""
    import aiohttp

    from p2pfl.runtime.deadline import wait_at_most

    async def send() -> tuple[int, bytes]:
        async with session.request(method, url, data=body, ssl=False) as response:
            return response.status, await response.read()

    try:
        return await wait_at_most(send(), timeout_s)
    except asyncio.TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except aiohttp.ClientError as exc:
        return f"cannot reach it ({exc})"


async def _status(seed: str, timeout_s: float) -> int:
    import aiohttp
    import msgpack

    from p2pfl.runtime.federation.gossip import PATH

    async with aiohttp.ClientSession() as session:
        async def get(url: str) -> tuple[int, bytes] | str:
            return await _request(session, "GET", url, timeout_s)

        answer = await get(seed + PATH)
        if isinstance(answer, str) or answer[0] != 200:
            print(f"{seed}: {answer if isinstance(answer, str) else f'{answer[0]} (not a federation member?)'}",
                  file=sys.stderr)
            return 2
        listing = msgpack.unpackb(answer[1], raw=False)
        me = listing["self"]
        rows = [(me["member"], me["url"], me["round"], "this node")]
        members = listing["members"]
        statuses = await asyncio.gather(*(get(m["url"] + "/v1/status") for m in members if m["url"]))
        answers = iter(statuses)
        for member in members:
            if not member["url"]:  # nobody can reach it to ask
                rows.append((member["member"], None, None, "-"))
                continue
            status = next(answers)
            if isinstance(status, str) or status[0] != 200:
                rows.append((member["member"], member["url"], None, status if isinstance(status, str) else str(status[0])))
            else:
                doc = json.loads(status[1])
                rows.append((member["member"], member["url"], doc.get("round"), "done" if doc.get("done") else "up"))
        print(f"{seed} sees {len(rows)} members (revocation list {listing['revocations']}):")
        for member, url, round_, state in rows:
            print(f"  {member:<16} {url or 'outbound only':<32} round {round_ if round_ is not None else '-':<5} {state}")
        for member, cause in listing.get("refused", {}).items():
            print(f"  refused {member}: {cause}")
    return 0
