"""Calendar-mode windows in the gateway: the plan quotes the earliest window and its price; a create that books it
is refused until the user confirmed exactly that window and price, and then carries it to the controller."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from mcp import Client
from mcp.types import ElicitResult

from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.server import build_server
from shared.domain.models import CalendarWindow, Tier
from tests.mcp.conftest import HF_TOKEN, GatewayWorld, refusal_confirmation
from tests.mcp.test_cli import tpuctl

ZONE = "us-east5-b"


class Windows:
    """Calendar advice as a table kept in memory: the first free start per zone (a zone absent has none)."""

    def __init__(self, starts: dict[str, datetime]) -> None:
        self.starts = starts
        self.asked: list[tuple[str, tuple[str, ...], int]] = []

    def earliest_window(
        self, accelerator: str, zones: Sequence[str], *, days: int, not_before: datetime
    ) -> CalendarWindow | None:
        self.asked.append((accelerator, tuple(zones), days))
        found = sorted((max(start, not_before), zone) for zone, start in self.starts.items() if zone in zones)
        if not found:
            return None
        start, zone = found[0]
        return CalendarWindow(zone=zone, start=start, end=start + timedelta(days=days))

    def book(self, name: str, accelerator: str, window: CalendarWindow, *, request_id: str) -> None:
        raise AssertionError("the gateway never books: the controller does")

    def procurement(self, zone: str, name: str) -> str | None:
        return None

    def release(self, zone: str, name: str) -> None:
        raise AssertionError("the gateway never releases")

    def list_names(self, zones: Sequence[str]) -> list[tuple[str, str]]:
        return []


def _core(world: GatewayWorld, windows: Windows | None) -> GatewayCore:
    world.secrets.put(world.settings.hf_token_secret, HF_TOKEN)
    return GatewayCore(dataclasses.replace(world.ports, calendar=windows))


def _create(core: GatewayCore, **extra: object) -> object:
    return core.create_deployment(
        deployment_id="gemma-a",
        model="gemma-4-26b-a4b",
        accelerator="v6e-4",
        zones=[ZONE],
        ttl_hours=30,
        book_calendar=True,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
def windows(world: GatewayWorld) -> Windows:
    start = world.ports.clock.now().replace(microsecond=0) + timedelta(days=3)
    return Windows({ZONE: start})


def test_the_plan_quotes_the_earliest_window_for_the_ttl_in_whole_days(world: GatewayWorld, windows: Windows) -> None:
    plan = _core(world, windows).plan(model="gemma-4-26b-a4b", accelerator="v6e-4", zones=[ZONE], ttl_hours=30)
    quote = plan.calendar
    assert quote is not None and quote.zone == ZONE and quote.days == 2 and quote.chips == 4
    assert quote.start == windows.starts[ZONE] and quote.end == windows.starts[ZONE] + timedelta(days=2)
    assert quote.usd_per_chip_hour == pytest.approx(1.89)  # the dated table's us-east5 calendar-mode rate
    assert quote.usd == pytest.approx(4 * 48 * 1.89)
    assert "paid for the whole window whether used or not" in quote.note
    assert windows.asked == [("v6e-4", (ZONE,), 2)]


def test_without_a_source_or_a_window_the_plan_says_why(world: GatewayWorld) -> None:
    none = _core(world, None).plan(model="gemma-4-26b-a4b", accelerator="v6e-4", zones=[ZONE])
    assert none.calendar is not None and none.calendar.zone is None and "no source" in none.calendar.note
    empty = _core(world, Windows({})).plan(model="gemma-4-26b-a4b", accelerator="v6e-4", zones=[ZONE])
    assert empty.calendar is not None and empty.calendar.note == f"no 1-day calendar-mode window for v6e-4 in {ZONE}"


def test_booking_is_refused_until_confirmed_and_then_carries_the_window(world: GatewayWorld, windows: Windows) -> None:
    core = _core(world, windows)
    with pytest.raises(GatewayError) as refused:
        _create(core)
    assert refused.value.code == "confirmation_required" and refused.value.field == "confirm"
    assert "book a calendar-mode reservation of v6e-4 for 'gemma-a'" in refused.value.problem
    assert f"${4 * 48 * 1.89:,.2f}" in refused.value.problem
    assert world.published() == []
    request = refused.value.confirmation
    assert request is not None and request.action == "book_calendar"
    _create(core, confirm=request.confirm)
    (message,) = world.published()
    spec = message.spec
    assert spec.calendar == CalendarWindow(
        zone=ZONE, start=windows.starts[ZONE], end=windows.starts[ZONE] + timedelta(days=2)
    )
    assert spec.tiers[0] is Tier.RESERVATION and spec.reservation_name == "tpuctl-cal-gemma-a"


def test_a_token_for_another_window_or_price_is_refused(world: GatewayWorld, windows: Windows) -> None:
    core = _core(world, windows)
    with pytest.raises(GatewayError) as refused:
        _create(core)
    token = refused.value.confirmation.confirm  # type: ignore[union-attr]
    windows.starts[ZONE] += timedelta(days=1)  # the window moved since the user saw it
    with pytest.raises(GatewayError) as moved:
        _create(core, confirm=token)
    assert "changed since the token was issued (the quoted window or its price changed" in moved.value.problem
    assert world.published() == []


def test_booking_needs_a_window_and_names_its_own_reservation(world: GatewayWorld) -> None:
    with pytest.raises(GatewayError) as none:
        _create(_core(world, Windows({})))
    assert none.value.code == "failed_precondition" and none.value.field == "book_calendar"
    start = world.ports.clock.now() + timedelta(days=1)
    with pytest.raises(GatewayError) as named:
        _create(_core(world, Windows({ZONE: start})), reservation_name="mine", tiers=["reservation"])
    assert named.value.field == "reservation_name"
    assert world.published() == []


def test_the_cli_books_only_with_the_persons_confirmation(world: GatewayWorld, windows: Windows) -> None:
    world.secrets.put(world.settings.hf_token_secret, HF_TOKEN)
    world.ports = dataclasses.replace(world.ports, calendar=windows)
    argv = ("deploy", "gemma-a", "--model", "gemma-4-26b-a4b", "--zone", ZONE, "--ttl-hours", "30", "--book-calendar")
    refused = tpuctl(world, *argv)
    assert refused.code != 0 and "book a calendar-mode reservation" in refused.stderr
    assert world.published() == []
    plan = tpuctl(world, "plan", "--model", "gemma-4-26b-a4b", "--zone", ZONE, "--ttl-hours", "30")
    assert f"calendar-mode window: {ZONE} from" in plan.stdout
    assert tpuctl(world, *argv, "--yes").code == 0
    (message,) = world.published()
    assert message.spec.calendar is not None and message.spec.calendar.zone == ZONE


@pytest.mark.anyio
async def test_over_mcp_the_refusal_carries_the_terms_and_a_token_books(world: GatewayWorld, windows: Windows) -> None:
    server = build_server(_core(world, windows))
    arguments = {
        "deployment_id": "gemma-a",
        "model": "gemma-4-26b-a4b",
        "zones": [ZONE],
        "ttl_hours": 30,
        "book_calendar": True,
    }
    async with Client(server) as session:
        refused = await session.call_tool("tpu_deploy", arguments)
        body = refusal_confirmation(refused)
        assert body["action"] == "book_calendar" and "paid for the whole window" in body["impact"]
        assert world.published() == []
        accepted = await session.call_tool("tpu_deploy", {**arguments, "confirm": body["confirm"]})
    assert not accepted.is_error
    (message,) = world.published()
    assert message.spec.calendar is not None and message.spec.reservation_name == "tpuctl-cal-gemma-a"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("action", "typed", "books"), [("accept", "gemma-a", True), ("accept", "yes", False), ("decline", None, False)]
)
async def test_a_client_with_elicitation_asks_the_user_with_the_terms(
    world: GatewayWorld, windows: Windows, action: str, typed: str | None, books: bool
) -> None:
    asked: list[str] = []

    async def callback(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action=action, content={"confirm": typed} if typed else None)  # type: ignore[arg-type]

    arguments = {"deployment_id": "gemma-a", "model": "gemma-4-26b-a4b", "zones": [ZONE], "book_calendar": True}
    async with Client(build_server(_core(world, windows)), elicitation_callback=callback) as session:
        result = await session.call_tool("tpu_deploy", arguments)
    assert len(asked) == 1 and "paid for the whole window whether used or not" in asked[0]
    assert result.is_error is not books
    published = world.published()
    assert len(published) == (1 if books else 0)
    if books:
        assert published[0].spec.calendar is not None
