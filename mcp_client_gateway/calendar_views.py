"""The plan's view of a calendar-mode window (issue 21, item 3), apart from ``models.py`` (its size)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CalendarQuoteView"]


class CalendarQuoteView(BaseModel):
    """The earliest calendar-mode window for the slice and its price, committed once booked."""

    model_config = ConfigDict(extra="forbid")

    zone: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    days: int
    chips: int
    usd_per_chip_hour: float | None = None
    usd: float | None = Field(default=None, description="The whole window's price, paid whether used or not.")
    price_source: str = ""
    note: str = Field(description="What the window is, or why there is none.")
