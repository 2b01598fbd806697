"""``OpenAiCompatibleClient`` against a loopback server replaying vLLM 0.32.0's recorded wire format."""

from __future__ import annotations

import pytest

from shared.adapters.openai_client import OpenAiCompatibleClient, base_url
from shared.domain.errors import CloudError, ErrorClass
from shared.ports import ModelChatRequest
from tests.support.openai_stub import StubConfig, serve_openai_stub

KEY = "stub-api-key-0123456789"


def request(endpoint: str, **overrides: object) -> ModelChatRequest:
    fields: dict[str, object] = {"endpoint": endpoint, "messages": (("user", "hi"),), "max_tokens": 8, "timeout_s": 5.0}
    fields.update(overrides)
    return ModelChatRequest(**fields)  # type: ignore[arg-type]


def test_a_streamed_chat_is_timed_at_the_first_content_chunk_with_usage_tokens() -> None:
    config = StubConfig(api_key=KEY, first_token_delay_s=0.1, token_interval_s=0.01, usage_completion_tokens=30)
    with serve_openai_stub(config) as stub:
        chat = OpenAiCompatibleClient().chat(request(stub.base_url + "/v1/", api_key=KEY))
    assert chat.model == "tiny-llama" and chat.finish_reason == "length"
    assert chat.content_chunks == 8 and chat.completion_tokens == 30 and chat.prompt_tokens == 9
    assert chat.ttft_s is not None and 0.1 <= chat.ttft_s < chat.last_token_s <= chat.total_s  # type: ignore[operator]
    assert chat.last_token_s - chat.ttft_s >= 0.06  # type: ignore[operator]
    assert stub.requests[0]["model"] == "tiny-llama"  # the first listed model, since none was named


def test_the_endpoint_check_reports_models_version_and_latencies() -> None:
    with serve_openai_stub(StubConfig(api_key=KEY)) as stub:
        check = OpenAiCompatibleClient().check(stub.base_url, KEY)
    assert check.health_status == 200 and check.health_ms is not None
    assert check.models == ("tiny-llama",) and check.max_model_len == 512 and check.version == "0.32.0"
    assert check.problems == ()


def test_a_check_without_the_key_lists_the_problem_instead_of_raising() -> None:
    with serve_openai_stub(StubConfig(api_key=KEY)) as stub:
        check = OpenAiCompatibleClient().check(stub.base_url, None)
    assert check.health_status == 200 and check.models == ()
    assert any("rejected the API key" in problem for problem in check.problems)
    assert all(KEY not in problem for problem in check.problems)


@pytest.mark.parametrize(
    ("config", "api_key", "error_class"),
    [
        (StubConfig(api_key=KEY), "wrong-key-000000", ErrorClass.PERMISSION),
        (StubConfig(fail_chat_status=400), None, ErrorClass.INVALID),
        (StubConfig(fail_chat_status=404), None, ErrorClass.NOT_FOUND),
        (StubConfig(fail_chat_status=503), None, ErrorClass.TRANSIENT),
        (StubConfig(fail_chat_status=429), None, ErrorClass.RATE_LIMIT),
    ],
)
def test_http_failures_are_classified(config: StubConfig, api_key: str | None, error_class: ErrorClass) -> None:
    with serve_openai_stub(config) as stub, pytest.raises(CloudError) as caught:
        OpenAiCompatibleClient().chat(request(stub.base_url, api_key=api_key, model="tiny-llama"))
    assert caught.value.error_class is error_class
    assert "wrong-key" not in caught.value.message


def test_a_refused_connection_is_transient() -> None:
    with serve_openai_stub() as stub:
        gone = stub.base_url
    with pytest.raises(CloudError) as caught:
        OpenAiCompatibleClient().chat(request(gone, model="tiny-llama"))
    assert caught.value.error_class is ErrorClass.TRANSIENT


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://10.0.0.5:8000", "http://10.0.0.5:8000"),
        ("http://10.0.0.5:8000/v1/", "http://10.0.0.5:8000"),
        ("https://gw.example.com/serve/v1", "https://gw.example.com/serve"),
    ],
)
def test_endpoints_are_normalised(endpoint: str, expected: str) -> None:
    assert base_url(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["file:///etc/passwd", "10.0.0.5:8000", "http://", "gopher://x"])
def test_anything_but_an_http_url_is_refused(endpoint: str) -> None:
    with pytest.raises(CloudError) as caught:
        base_url(endpoint)
    assert caught.value.error_class is ErrorClass.INVALID
