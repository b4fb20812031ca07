"""Admission by certificate, without a network: certificates, revocation lists, member records,
the directory that holds them, and the roster that refuses a member taken out, naming why."""

from __future__ import annotations

import dataclasses

import pytest

from p2pfl.runtime.federation.certificates import (EXPIRED, MALFORMED, REVOKED, UNKNOWN, WRONG_FEDERATION, Certificate,
                                                   Refused, Revocations, check, check_revocations, issue, revoke)
from p2pfl.runtime.federation.directory import Directory
from p2pfl.runtime.federation.gossip import decode, encode
from p2pfl.runtime.federation.records import MemberRecord, check_record, sign_record
from p2pfl.wire import NodeKey, NotAMember, Roster, UnknownSender

NOW = 1_800_000_000.0


@pytest.fixture()
def fed() -> NodeKey:
    return NodeKey.generate()


def _member(fed: NodeKey, name: str, *, now: float = NOW, expires: float | None = None,
            url: str | None = "http://10.0.0.1:9000") -> tuple[NodeKey, MemberRecord]:
    key = NodeKey.generate()
    cert = issue(fed, name, key.public_hex, now=now, expires=expires)
    return key, sign_record(key, cert, url, now=now)


def _cause(call) -> str:
    with pytest.raises(Refused) as info:
        call()
    return info.value.cause


def test_a_certificate_admits_its_key_for_its_federation_until_it_expires(fed: NodeKey) -> None:
    key = NodeKey.generate()
    cert = issue(fed, "alpha", key.public_hex, now=NOW, expires=NOW + 60)
    check(cert, fed.public_hex, now=NOW + 59, revocations=None)
    assert _cause(lambda: check(cert, fed.public_hex, now=NOW + 60, revocations=None)) == EXPIRED
    other = NodeKey.generate()
    assert _cause(lambda: check(cert, other.public_hex, now=NOW, revocations=None)) == WRONG_FEDERATION
    # Signed by another key that claims this federation: not one this federation could have signed.
    forged = dataclasses.replace(issue(other, "alpha", key.public_hex, now=NOW), federation=fed.public_hex)
    assert _cause(lambda: check(forged, fed.public_hex, now=NOW, revocations=None)) == UNKNOWN
    # Any field changed after signing breaks the signature.
    for field, value in (("member", "beta"), ("public_key", other.public_hex), ("expires", None), ("issued", NOW - 1)):
        tampered = dataclasses.replace(cert, **{field: value})
        assert _cause(lambda t=tampered: check(t, fed.public_hex, now=NOW, revocations=None)) == UNKNOWN, field


def test_a_certificate_file_round_trips_and_a_missing_or_broken_one_is_named(fed: NodeKey, tmp_path) -> None:
    cert = issue(fed, "alpha", NodeKey.generate().public_hex, now=NOW, expires=NOW + 1.5)
    cert.save(tmp_path / "alpha.cert")
    assert Certificate.load(tmp_path / "alpha.cert") == cert
    assert _cause(lambda: Certificate.from_dict(None)) == UNKNOWN
    assert _cause(lambda: Certificate.from_dict({**cert.to_dict(), "extra": 1})) == MALFORMED
    assert _cause(lambda: Certificate.from_dict({**cert.to_dict(), "public_key": "zz"})) == MALFORMED
    assert _cause(lambda: Certificate.load(tmp_path / "none.cert")) == UNKNOWN


def test_revocation_covers_certificates_issued_before_it_not_a_readmission_after(fed: NodeKey) -> None:
    key = NodeKey.generate()
    old = issue(fed, "alpha", key.public_hex, now=NOW)
    revoked = revoke(fed, None, "alpha", now=NOW + 10)
    check_revocations(revoked, fed.public_hex)
    assert _cause(lambda: check(old, fed.public_hex, now=NOW + 11, revocations=revoked)) == REVOKED
    readmitted = issue(fed, "alpha", NodeKey.generate().public_hex, now=NOW + 20)
    check(readmitted, fed.public_hex, now=NOW + 21, revocations=revoked)
    newer = revoke(fed, revoked, "beta", now=NOW + 30)
    assert newer.number > revoked.number and set(newer.revoked) == {"alpha", "beta"}


def test_a_revocation_list_not_signed_by_the_federation_is_refused(fed: NodeKey) -> None:
    good = revoke(fed, None, "alpha", now=NOW)
    widened = Revocations(good.federation, good.number + 1, {**good.revoked, "beta": NOW}, good.signature)
    assert _cause(lambda: check_revocations(widened, fed.public_hex)) == MALFORMED
    stranger = revoke(NodeKey.generate(), None, "alpha", now=NOW)
    assert _cause(lambda: check_revocations(stranger, fed.public_hex)) == WRONG_FEDERATION
    assert _cause(lambda: Revocations.from_dict({"federation": fed.public_hex})) == MALFORMED


def test_a_member_record_is_signed_by_the_key_its_certificate_names(fed: NodeKey) -> None:
    key, record = _member(fed, "alpha")
    check_record(record, fed.public_hex, now=NOW, revocations=None)
    assert MemberRecord.from_dict(decode(encode({"records": [record.to_dict()]}))["records"][0]) == record
    moved = dataclasses.replace(record, url="http://10.0.0.9:9000")  # a relay cannot redirect a member
    assert _cause(lambda: check_record(moved, fed.public_hex, now=NOW, revocations=None)) == MALFORMED
    _, beta = _member(fed, "beta")
    borrowed = dataclasses.replace(beta, member="alpha")  # beta's certificate under alpha's name
    assert _cause(lambda: check_record(borrowed, fed.public_hex, now=NOW, revocations=None)) == MALFORMED
    with pytest.raises(ValueError, match="wrong certificate or wrong key file"):
        sign_record(NodeKey.generate(), record.certificate, None, now=NOW)


def test_the_directory_admits_the_newest_record_and_names_each_refusal(fed: NodeKey) -> None:
    clock = [NOW]
    _, own = _member(fed, "self")
    directory = Directory(fed.public_hex, own, clock=lambda: clock[0])
    admitted, removed = [], []
    directory.on_admitted.append(lambda r: admitted.append((r.member, r.url)))
    directory.on_removed.append(lambda m, cause, detail: removed.append((m, cause)))
    key, alpha = _member(fed, "alpha")
    assert directory.offer(alpha) == alpha
    assert directory.offer(alpha) is None  # heard again: nothing changes
    moved = sign_record(key, alpha.certificate, "http://10.0.0.2:9000", now=NOW + 5)
    assert directory.offer(moved) == moved and directory.offer(alpha) is None  # an older record never wins
    assert directory.reachable() == {"alpha": "http://10.0.0.2:9000"}
    assert admitted == [("alpha", "http://10.0.0.1:9000"), ("alpha", "http://10.0.0.2:9000")]

    stranger = NodeKey.generate()
    _, foreign = _member(stranger, "foreign")
    _, late = _member(fed, "late", now=NOW - 100, expires=NOW - 1)
    bare = {**alpha.to_dict(), "member": "bare", "certificate": None}
    assert directory.offer_many([foreign.to_dict(), late.to_dict(), bare]) == []
    assert {m: c for m, (c, _) in directory.refused.items()} == {
        "foreign": WRONG_FEDERATION, "late": EXPIRED, "bare": UNKNOWN}

    _, short = _member(fed, "short", expires=NOW + 10)
    directory.offer(short)
    clock[0] = NOW + 10
    assert directory.expire() == ["short"]
    assert directory.offer_revocations(revoke(fed, None, "alpha", now=NOW + 11)) is True
    assert removed == [("short", EXPIRED), ("alpha", REVOKED)]
    assert directory.offer_revocations(revoke(fed, None, "nobody", now=NOW)) is False  # older list: ignored
    assert directory.records == {} and directory.refused["alpha"][0] == REVOKED
    # The revoked member's record, passed on again by someone who had not heard: refused.
    assert _cause(lambda: directory.offer(moved)) == REVOKED


def test_an_exchange_full_of_refused_records_is_not_read_past_a_few(fed: NodeKey) -> None:
    from p2pfl.runtime.federation.directory import REFUSED_PER_EXCHANGE

    _, own = _member(fed, "self")
    directory = Directory(fed.public_hex, own, clock=lambda: NOW)
    stranger = NodeKey.generate()
    junk = [_member(stranger, f"fake{i}")[1].to_dict() for i in range(REFUSED_PER_EXCHANGE + 5)]
    _, honest = _member(fed, "honest")
    assert directory.offer_many([*junk, honest.to_dict()]) == []
    assert directory.refusals == REFUSED_PER_EXCHANGE and "honest" not in directory.records
    assert directory.offer_many([honest.to_dict(), *junk]) == [honest]


def test_an_exchange_that_is_not_one_is_refused_as_malformed() -> None:
    for body in (b"\xc1", encode({"records": {}}), encode({"from": None, "other": 1}), b"\x00" * (5 << 20)):
        assert _cause(lambda b=body: decode(b)) == MALFORMED


def test_a_roster_member_taken_out_is_refused_with_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    key = NodeKey.generate()
    roster = Roster({"alpha": key.public_hex})
    data = b"payload"
    roster.verify("alpha", key.sign(data), data)
    roster.refuse("alpha", REVOKED, "alpha was revoked by the federation")
    assert "alpha" not in roster
    with pytest.raises(NotAMember) as info:
        roster.verify("alpha", key.sign(data), data)
    assert info.value.reason == REVOKED and info.value.status == 403
    with pytest.raises(UnknownSender) as unknown:
        roster.verify("beta", key.sign(data), data)
    assert unknown.value.reason == "unknown_sender"
    roster.admit("alpha", key.public_hex, expires=NOW + 1)  # re-admitted, until its certificate expires
    monkeypatch.setattr("p2pfl.wire.keys.time.time", lambda: NOW)
    roster.verify("alpha", key.sign(data), data)
    monkeypatch.setattr("p2pfl.wire.keys.time.time", lambda: NOW + 1)
    assert "alpha" not in roster
    with pytest.raises(NotAMember) as expired:
        roster.verify("alpha", key.sign(data), data)
    assert expired.value.reason == EXPIRED


@pytest.mark.parametrize("setting,field", [('runtime.tls=true', "federation.url"), ('algorithm.name="di"', "algorithm.name")])
def test_a_federation_node_refuses_what_a_federation_cannot_do_yet_by_name(tmp_path, capsys, setting: str,
                                                                           field: str) -> None:
    from p2pfl.cli import main

    from ..helpers import write_tiny

    scenario = write_tiny(tmp_path, nodes=2)
    assert main(["federation", "init", "--dir", str(tmp_path / "fed")]) == 0
    assert main(["keygen", "alpha", "--out", str(tmp_path)]) == 0
    assert main(["federation", "admit", str(tmp_path / "alpha.pub"), "--id", "alpha", "--dir", str(tmp_path / "fed"),
                 "--out", str(tmp_path / "alpha.cert")]) == 0
    (tmp_path / "node.toml").write_text(
        f'id = "alpha"\nkey_file = "alpha.key"\nscenario = "{scenario}"\nport = 9\noverrides = [{setting!r}]\n'
        '[federation]\npublic_key = "fed/federation.pub"\ncertificate = "alpha.cert"\n'
        'seeds = ["http://127.0.0.1:9"]\nurl = "http://127.0.0.1:9"\n')
    capsys.readouterr()
    assert main(["node", str(tmp_path / "node.toml")]) == 2
    assert field in capsys.readouterr().err


def test_two_thousand_hostile_exchanges_get_an_answer_and_change_nothing(fed: NodeKey) -> None:
    """Random msgpack, valid payloads with a field replaced by junk, and bit-flipped bodies: each is
    answered 200 or 403 (never an exception), and no member is admitted or removed by them."""
    import asyncio
    import random

    import msgpack

    from p2pfl.runtime.federation.gossip import Gossip, encode

    rng = random.Random(7)
    _, own = _member(fed, "self")
    gossip = Gossip(Directory(fed.public_hex, own, clock=lambda: NOW))
    _, alpha = _member(fed, "alpha")
    assert gossip.directory.offer(alpha) == alpha
    _, beta = _member(fed, "beta")
    valid = {"from": beta.to_dict(), "records": [alpha.to_dict()], "revocations": revoke(fed, None, "x", now=NOW).to_dict()}

    def junk(depth: int = 0):
        pick = rng.randrange(8 if depth < 2 else 5)
        if pick == 5:
            return [junk(depth + 1) for _ in range(3)]
        if pick == 6:
            return {rng.choice(["member", "url", "at", "certificate", "x"]): junk(depth + 1)}
        return [None, True, rng.randrange(-2**63, 2**63), rng.random() * 1e300,
                "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(0, 30))), None, None, b"\x00" * 3][pick]

    def mutated() -> dict:
        payload = {k: (dict(v) if isinstance(v, dict) else list(v)) for k, v in valid.items()}
        where = rng.choice(["from", "revocations"])
        field = rng.choice(list(payload[where]))
        payload[where][field] = junk()
        return payload

    statuses = set()

    async def run() -> None:
        for i in range(2000):
            kind = i % 3
            if kind == 0:
                body = msgpack.packb(junk(), use_bin_type=True)
            elif kind == 1:
                body = encode(mutated())
            else:
                body = bytearray(encode(valid))
                for _ in range(rng.randrange(1, 6)):
                    body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
                body = bytes(body)
            status, _ = await gossip.handle(body)
            statuses.add(status)

    asyncio.run(run())
    assert statuses == {200, 403}  # both: some mutations leave a payload that is still valid
    assert set(gossip.directory.records) <= {"alpha", "beta"} and "alpha" in gossip.directory.records
    assert gossip.directory.revocations.number == 0 or gossip.directory.revocations.revoked == {"x": NOW}


def test_a_flood_is_answered_with_the_revocations_only_and_an_exchange_with_the_members(fed: NodeKey) -> None:
    """Every member floods a new revocation list to every other: answered each with its whole
    member list, 100 members spent N² lists and their outbound-only members heard 4.4 gossip
    periods late, not 2 (`python benchmarks/revocation_spread.py`, docs/security.md)."""
    import asyncio

    from p2pfl.runtime.federation.gossip import Gossip

    _, own = _member(fed, "self")
    gossip = Gossip(Directory(fed.public_hex, own, clock=lambda: NOW))
    for name in ("alpha", "beta"):
        gossip.directory.offer(_member(fed, name)[1])
    _, gamma = _member(fed, "gamma")
    revocations = revoke(fed, None, "x", now=NOW).to_dict()
    status, answer = asyncio.run(gossip.handle(encode({"from": gamma.to_dict(), "revocations": revocations})))
    assert status == 200 and "records" not in decode(answer) and decode(answer)["revocations"]["number"] > 0
    status, answer = asyncio.run(gossip.handle(encode({"from": gamma.to_dict(), "records": [], "revocations": revocations})))
    assert status == 200 and {r["member"] for r in decode(answer)["records"]} == {"alpha", "beta", "gamma"}
