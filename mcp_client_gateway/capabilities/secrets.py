"""Secrets: the Hugging Face token, stored as a new secret version and never returned, logged or echoed;
replacing a different stored token needs a confirmation token."""

from __future__ import annotations

from mcp_client_gateway.capabilities.checks import hf_token
from mcp_client_gateway.capabilities.common import GatewayPorts, log
from mcp_client_gateway.confirmation import ConfirmationRequest, Confirmations
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.models import SecretSaved
from shared.domain.errors import InvalidMessage
from shared.logging import register_secret

__all__ = ["Secrets"]


class Secrets:
    """The Hugging Face token in the secret store."""

    def __init__(self, ports: GatewayPorts, confirmations: Confirmations) -> None:
        self.ports = ports
        self.confirmations = confirmations

    def hf_token_exists(self) -> bool:
        """Whether a Hugging Face token is stored (its value is read only to register it for redaction)."""
        return self.ports.secrets.get(self.ports.settings.hf_token_secret) is not None

    def hf_token_confirmation(self, token: str) -> ConfirmationRequest | None:
        """The confirmation saving ``token`` needs (it replaces a different stored one), or None; changes nothing."""
        token = hf_token(token)
        name = self.ports.settings.hf_token_secret
        existing = self.ports.secrets.get(name)
        if existing is None or existing == token:
            return None
        return self.confirmations.issue(
            "replace_hf_token", name, self._secret_state(existing, token), _replace_impact(name)
        )

    def save_hf_token(self, token: str, *, confirm: str | None = None) -> SecretSaved:
        """Store the Hugging Face token as a new secret version; replacing a different one needs ``confirm``,
        a token from :meth:`hf_token_confirmation` (or from the refusal of an unconfirmed call)."""
        token = hf_token(token)
        register_secret(token)
        name = self.ports.settings.hf_token_secret
        existing = self.ports.secrets.get(name)
        if existing is not None:
            if existing == token:
                return SecretSaved(name=name, version="unchanged", replaced=False)
            state = self._secret_state(existing, token)
            if confirm is None or confirm == "":
                request = self.confirmations.issue("replace_hf_token", name, state, _replace_impact(name))
                raise self.confirmations.refusal(request)
            self.confirmations.check(
                confirm,
                "replace_hf_token",
                name,
                state,
                changed="the stored token, or the token to save, is not the one confirmed",
            )
        try:
            version = self.ports.secrets.put(name, token)
        except InvalidMessage as exc:
            raise GatewayError("invalid_argument", "token", exc.problem, exc.fix) from None
        log.info("stored a new version of the Hugging Face token secret", extra={"secret": name})
        return SecretSaved(name=name, version=version, replaced=existing is not None)

    def _secret_state(self, existing: str, token: str) -> str:
        return "s-" + self.confirmations.fingerprint(existing, token)


def _replace_impact(name: str) -> str:
    return f"a Hugging Face token is already stored in '{name}'; saving replaces it"
