"""Confirmation tokens: a destructive action runs only with a token this gateway issued for exactly that action.

Why: a model can be steered by text it reads (a log line, a web page, a tool result). When confirming meant
passing ``confirm=<deployment id>``, injected text could supply that in the very call it asked for. Now a call
without a valid token is refused, publishes and writes nothing, and the refusal carries the impact and a token
that no text the model was shown beforehand can contain:

    tpuctl-confirm.<action>.<target>.<state>.<expiry>.<mac>

- ``action``: ``delete``, ``stop``, ``restart``, ``update`` (a spec update that replaces a running slice) or
  ``replace_hf_token``; ``target``: the deployment id (or the secret's name);
- ``state``: what the user is shown the impact of. For a deployment ``g<generation>-<digest>`` over its
  generation, desired state and creation time (a spec update, a stop or start, or a re-creation under the
  same id changes it; the status the controller rewrites every tick does not); for ``update`` the digest also
  covers the new spec, so the token confirms only the change the user was shown. For the token secret a digest
  of the stored value and of the value to save;
- ``expiry``: Unix seconds on the gateway's clock (``Clock`` port), ``CONFIRM_TTL_S`` after issue. On the
  local cloud's accelerated clock the window is scaled, so it stays five minutes of wall time;
- ``mac``: HMAC-SHA256 over all of the above with a random key made per process (tokens do not survive a
  restart, and one gateway's tokens are worthless to another).

A token confirms one call: once accepted it is spent (remembered until it expires), so one "yes" cannot be
replayed into a second restart.

A token for another action, another target, a changed deployment, an expired or an altered one is refused
with a one-line error naming ``confirm`` and the fix. Elicitation (the client asks the user directly) is the
other way to confirm: the server then mints the token itself once the user accepted (``server.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import secrets
import threading
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn, get_args

from pydantic import BaseModel, ConfigDict, Field

from mcp_client_gateway import bounds
from mcp_client_gateway.errors import ConfirmRef, Fix, GatewayError, Words
from mcp_client_gateway.interface_words import CONFIRMED_BY
from shared.ports import Clock

__all__ = ["CONFIRM_TTL_S", "TOKEN_PREFIX", "ConfirmAction", "ConfirmationRequest", "Confirmations"]

ConfirmAction = Literal["delete", "stop", "restart", "update", "replace_hf_token", "book_calendar"]
CONFIRM_TTL_S = 300.0
TOKEN_PREFIX = "tpuctl-confirm"  # noqa: S105 - a marker, not a secret

_ACTIONS: tuple[str, ...] = get_args(ConfirmAction)
_DOING: dict[str, str] = {
    "delete": "deleting",
    "stop": "stopping",
    "restart": "restarting vLLM on",
    "update": "updating",
    "replace_hf_token": "replacing the Hugging Face token in",
    "book_calendar": "booking a calendar-mode window for",
}
_STATE = re.compile(r"^[a-z0-9-]{1,48}$")
_MAC = re.compile(r"^[A-Za-z0-9_-]{43}$")
_TARGET = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,254}$")
_NOT_ISSUED = "is not a confirmation token this gateway issued (a deployment id or other text does not confirm)"
_FIX = (
    "call again without confirm: the refusal shows the impact and returns a fresh token; show the impact to the "
    "user and, only once they agree, pass that token as confirm"
)


class ConfirmationRequest(BaseModel):
    """What a destructive action will do, and the token that confirms exactly it (for a short while)."""

    model_config = ConfigDict(extra="forbid")

    action: ConfirmAction
    target: str = Field(description="The deployment id (or, for replace_hf_token, the secret's name).")
    impact: str = Field(description="What the action does: show this to the user before confirming.")
    confirm: str = Field(description="The token to pass as `confirm` once the user agreed; it confirms only this.")
    expires_at: datetime = Field(description="When the token stops working (the gateway's clock).")
    valid_for_s: float = Field(description="Wall seconds the token is valid for.")
    generation: int | None = Field(default=None, description="The deployment generation the token is bound to.")
    next_step: str

    def how_to_confirm(self, lead: str = "") -> Fix:
        """``lead`` then how to confirm, worded per interface: ``call again with confirm='TOKEN'`` over MCP,
        ``run tpuctl delete ID --confirm ID (or pass --yes)`` on the command line."""
        tool, selected = CONFIRMED_BY[self.action]
        positional = selected + (() if self.action == "replace_hf_token" else (("deployment_id", self.target),))
        return Fix(lead, ConfirmRef(tool, self.target, self.confirm, positional))


class Confirmations:
    """Issues and checks confirmation tokens with a per-process random key on the gateway's clock."""

    def __init__(self, clock: Clock, *, ttl_s: float = CONFIRM_TTL_S, key: bytes | None = None) -> None:
        self._clock = clock
        self._key = key if key is not None else secrets.token_bytes(32)
        self.ttl_s = ttl_s
        self._spent: dict[str, int] = {}  # mac -> expiry of the tokens already used
        self._lock = threading.Lock()

    def fingerprint(self, *parts: str) -> str:
        """A short keyed digest of ``parts`` (reveals nothing about them, e.g. a stored secret)."""
        digest = hmac.new(self._key, b"state|" + "|".join(parts).encode("utf-8", "surrogatepass"), "sha256")
        return digest.hexdigest()[:12]

    def issue(
        self, action: ConfirmAction, target: str, state: str, impact: str, *, generation: int | None = None
    ) -> ConfirmationRequest:
        """A token for ``action`` on ``target`` in ``state``, valid for ``ttl_s`` (wall seconds)."""
        now = self._clock.now()
        expiry = math.floor(now.timestamp()) + math.ceil(self.ttl_s * self._time_scale())
        token = ".".join((TOKEN_PREFIX, action, target, state, str(expiry), self._mac(action, target, state, expiry)))
        minutes = f"{self.ttl_s / 60:g} minute{'s' if self.ttl_s != 60 else ''}"
        return ConfirmationRequest(
            action=action,
            target=target,
            impact=impact,
            confirm=token,
            expires_at=datetime.fromtimestamp(expiry, UTC),
            valid_for_s=self.ttl_s,
            generation=generation,
            next_step=f"Show the impact to the user. Only if they agree, call again with the same arguments and "
            f"confirm set to this token (valid for {minutes}, only for {_DOING[action]} '{target}' as it is now).",
        )

    def refusal(self, request: ConfirmationRequest) -> GatewayError:
        """The refusal of an unconfirmed call: the impact, and the fix that carries the token."""
        minutes = f"{request.valid_for_s / 60:g} min"
        return GatewayError(
            "confirmation_required",
            "confirm",
            f"{request.impact}; nothing was changed",
            Fix(
                *request.how_to_confirm("show this to the user and, only once they agree, ").parts,
                Words(f" (valid {minutes}, only for {_DOING[request.action]} '{request.target}' as it is now)"),
            ),
            confirmation=request,
        )

    def check(self, confirm: Any, action: ConfirmAction, target: str, state: str, *, changed: str = "") -> None:
        """Accept ``confirm`` only if this gateway issued it for ``action`` on ``target`` in ``state``, unexpired.

        ``changed`` says how the target changed, for the refusal of a token issued before a change.
        """
        token = bounds.text("confirm", confirm, max_chars=bounds.CONFIRM_CHARS, fix=_FIX)
        parts = token.split(".")
        if len(parts) < 6 or parts[0] != TOKEN_PREFIX:
            self._refuse(_NOT_ISSUED)
        claimed_action, claimed_target = parts[1], ".".join(parts[2:-3])
        claimed_state, claimed_expiry, mac = parts[-3], parts[-2], parts[-1]
        well_formed = (
            claimed_action in _ACTIONS
            and _TARGET.fullmatch(claimed_target) is not None
            and _STATE.fullmatch(claimed_state) is not None
            and claimed_expiry.isdigit()
            and len(claimed_expiry) <= 12
            and _MAC.fullmatch(mac) is not None
        )
        if not well_formed:
            self._refuse(_NOT_ISSUED)
        expiry = int(claimed_expiry)
        expected = self._mac(claimed_action, claimed_target, claimed_state, expiry)
        if not hmac.compare_digest(expected, mac):
            self._refuse("the token was not issued by this gateway, or was altered (tokens do not survive a restart)")
        if claimed_action != action:
            self._refuse(f"the token confirms {_DOING[claimed_action]} '{claimed_target}', not {_DOING[action]} it")
        if claimed_target != target:
            self._refuse(f"the token is for '{claimed_target}', not '{target}'")
        now = self._clock.now()
        if now.timestamp() > expiry:
            when = datetime.fromtimestamp(expiry, UTC).strftime("%H:%M:%S UTC")
            self._refuse(f"the token expired at {when} (a token is valid for {self.ttl_s / 60:g} minutes)")
        if not hmac.compare_digest(claimed_state, state):
            self._refuse(f"'{target}' changed since the token was issued{f' ({changed})' if changed else ''}")
        with self._lock:
            for spent, until in list(self._spent.items()):
                if until < now.timestamp():
                    del self._spent[spent]
            if mac in self._spent:
                self._refuse("the token was already used (a token confirms one call)")
            self._spent[mac] = expiry

    def _mac(self, action: str, target: str, state: str, expiry: int) -> str:
        message = "|".join(("v1", action, target, state, str(expiry))).encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def _time_scale(self) -> float:
        """Virtual seconds per wall second of the clock (the local cloud runs faster); 1 for a real clock."""
        try:
            scale = getattr(self._clock, "time_scale", None)
        except Exception:  # the simulator did not answer: fall back to wall time
            return 1.0
        return float(scale) if isinstance(scale, int | float) and math.isfinite(scale) and scale > 1 else 1.0

    @staticmethod
    def _refuse(problem: str) -> NoReturn:
        raise GatewayError("confirmation_required", "confirm", f"{problem}; nothing was changed", _FIX)
