"""Where a background mount's server sends its messages when no log file is given."""

from __future__ import annotations

import syslog

from prep.mount import messages


def test_without_a_log_file_messages_go_to_syslog_as_shardprep_mount_when_there_is_one(monkeypatch, tmp_path):
    sent = []
    monkeypatch.setattr(messages, "SYSLOG_SOCKET", str(tmp_path))  # a path that exists, as /dev/log would
    monkeypatch.setattr(syslog, "openlog", lambda *args: sent.append(("openlog", *args)))
    monkeypatch.setattr(syslog, "syslog", lambda *args: sent.append(("syslog", *args)))
    said = messages.in_background(None)
    said.say("shard-001.tar changed")
    assert said.where == "syslog (journalctl -t shardprep-mount)"
    assert sent == [
        ("openlog", "shardprep-mount", syslog.LOG_PID, syslog.LOG_USER),
        ("syslog", syslog.LOG_WARNING, "shard-001.tar changed"),
    ]


def test_without_a_log_file_or_syslog_messages_are_not_kept(monkeypatch, tmp_path):
    monkeypatch.setattr(messages, "SYSLOG_SOCKET", str(tmp_path / "no-log"))

    def no_syslog(*args: object) -> None:
        raise AssertionError(f"sent to syslog: {args}")

    monkeypatch.setattr(syslog, "syslog", no_syslog)
    said = messages.in_background(None)
    said.say("shard-001.tar changed")
    assert said.where is None
