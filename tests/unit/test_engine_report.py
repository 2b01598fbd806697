"""The node agent's engine reporter fed by the log shipper: the raw lines in order, the facts to ``tpuctl/engine``.

The container log and sink are the log shipper tests' stateful stand-ins; the guest attribute is a list that keeps
every value written, and can be down as a metadata server can.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from node_agent.engine_report import EngineReporter
from shared.domain.engine_facts import facts_from
from tests.unit.test_log_shipper import Clock, ContainerLog, Sink, drain, shipper_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


class GuestAttribute:
    def __init__(self) -> None:
        self.values: list[str] = []
        self.down = False

    def __call__(self, value: str) -> None:
        if self.down:
            raise ConnectionError("metadata server unreachable")
        self.values.append(value)


def test_the_shipper_shows_the_real_start_up_log_and_the_facts_are_written_once() -> None:
    log, sink, clock, attribute = ContainerLog(), Sink(), Clock(), GuestAttribute()
    reporter = EngineReporter(attribute)
    log.write(*(FIXTURES / "real_vllm_serve.log").read_text(encoding="utf-8").splitlines())
    drain(shipper_for(log, sink, clock, observe=reporter.observe), clock)
    assert reporter.publish_once() is True and reporter.publish_once() is False  # unchanged: not written again
    written = facts_from(json.loads(attribute.values[-1]))
    assert written is not None and (written.max_model_len, written.kv_cache_tokens) == (512, 1_048_576)
    assert (written.prefix_caching, written.enforce_eager, written.tensor_parallel) == (True, True, 1)
    assert len(sink.texts) == len([line for line in log.lines if line.text.strip()])  # shipping unchanged


def test_a_watcher_that_fails_does_not_stop_the_shipping() -> None:
    log, sink, clock = ContainerLog(), Sink(), Clock()

    def broken(_line: str) -> None:
        raise RuntimeError("bug")

    log.write("INFO 12-05 12:00:00 [x.py:1] one", "INFO 12-05 12:00:01 [x.py:1] two")
    drain(shipper_for(log, sink, clock, observe=broken), clock)
    assert sink.texts == [line.text for line in log.lines]


def test_a_failed_write_is_tried_again_on_the_next_round() -> None:
    attribute = GuestAttribute()
    reporter = EngineReporter(attribute, interval_s=0.01)
    reporter.observe("Initializing a V1 LLM engine (v0.32.0) with config: max_seq_len=512, seed=0")
    attribute.down = True
    assert reporter.publish_once() is False and attribute.values == []
    attribute.down = False
    stop = threading.Event()
    stop.set()
    reporter.run(stop)  # the last round on the way out
    assert len(attribute.values) == 1 and '"max_model_len":512' in attribute.values[0]


def test_lines_before_any_engine_write_nothing() -> None:
    attribute = GuestAttribute()
    reporter = EngineReporter(attribute)
    reporter.observe("INFO GPU KV cache size: 1,000 tokens")
    assert reporter.publish_once() is False and reporter.facts is None and attribute.values == []
