"""A node's round records go through one open file: the same lines as `append_record`, opened once, up front."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from p2pfl.runtime import files
from p2pfl.runtime.files import RecordAppender, append_record, read_records


def test_an_appender_writes_what_append_record_writes_and_opens_the_file_once(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"round": 1, "test_acc": 0.5}, {"round": 2, "test_acc": 0.75}, {"round": 3, "test_acc": None}]
    by_function, by_appender = tmp_path / "a" / "f.jsonl", tmp_path / "b" / "f.jsonl"
    for path in (by_function, by_appender):  # what a writer killed mid-line leaves behind
        path.parent.mkdir()
        path.write_text('{"round": 0}\n{"round": 1, "te')
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(files.os, "open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
    for record in records:
        append_record(by_function, record)
    with RecordAppender(by_appender) as appender:
        assert opened.count(str(by_appender)) == 1  # opened with the node, before its first round
        for record in records:
            appender.append(record)
    appender.close()  # twice is fine
    assert by_appender.read_bytes() == by_function.read_bytes()
    assert list(read_records(by_appender)) == [{"round": 0}, *records]  # the half line spoils only itself
    assert opened.count(str(by_function)) == 3 and opened.count(str(by_appender)) == 1
