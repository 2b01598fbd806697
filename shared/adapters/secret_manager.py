"""SecretStore on Google Secret Manager. Values are registered for log redaction as soon as they are seen."""

from __future__ import annotations

import contextlib
from typing import Any

from google.api_core import exceptions as gexc

from shared.domain.errors import InvalidMessage, PermanentError, TransientError
from shared.logging import register_secret

__all__ = ["SecretManagerStore"]


class SecretManagerStore:
    """Reads the latest version; ``put`` adds a version (creating the secret if it is absent).

    ``endpoint`` points the client elsewhere (the production-path twin's stand-in) over REST, anonymous, as the
    other adapters with an endpoint do.
    """

    def __init__(self, project: str, client: Any | None = None, *, endpoint: str | None = None) -> None:
        self._project = project
        self._client = client
        self._endpoint = endpoint

    def _api(self) -> Any:
        if self._client is None:
            from google.cloud import secretmanager

            if self._endpoint:
                from google.api_core.client_options import ClientOptions
                from google.auth.credentials import AnonymousCredentials

                self._client = secretmanager.SecretManagerServiceClient(
                    transport="rest",
                    credentials=AnonymousCredentials(),
                    client_options=ClientOptions(api_endpoint=self._endpoint),
                )
            else:
                self._client = secretmanager.SecretManagerServiceClient()
        return self._client

    def get(self, name: str) -> str | None:
        path = f"projects/{self._project}/secrets/{name}/versions/latest"
        try:
            response = self._api().access_secret_version(request={"name": path})
        except gexc.NotFound:
            return None
        except (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.InternalServerError) as exc:
            raise TransientError(f"Secret Manager unavailable reading {name}") from exc
        except gexc.PermissionDenied as exc:
            raise PermanentError(f"no permission to read secret {name}: grant secretAccessor on it") from exc
        value = response.payload.data.decode("utf-8")
        register_secret(value)
        return value

    def put(self, name: str, value: str) -> str:
        if not value:
            raise InvalidMessage("value", "is empty", "give the secret's value")
        register_secret(value)
        api = self._api()
        parent = f"projects/{self._project}"
        # Made already, by us or by Terraform (which leaves writers only secretVersionAdder on it).
        with contextlib.suppress(gexc.AlreadyExists, gexc.PermissionDenied):
            api.create_secret(
                request={"parent": parent, "secret_id": name, "secret": {"replication": {"automatic": {}}}}
            )
        try:
            version = api.add_secret_version(
                request={"parent": f"{parent}/secrets/{name}", "payload": {"data": value.encode("utf-8")}}
            )
        except (gexc.ServiceUnavailable, gexc.DeadlineExceeded) as exc:
            raise TransientError(f"Secret Manager unavailable writing {name}") from exc
        except (gexc.PermissionDenied, gexc.NotFound) as exc:
            raise PermanentError(
                f"cannot add a version to secret {name}: create it (terraform apply) and grant this identity "
                "roles/secretmanager.secretVersionAdder on it"
            ) from exc
        return str(version.name)
