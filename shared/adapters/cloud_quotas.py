"""``QuotaApi`` on the Cloud Quotas API v1 (google-cloud-quotas, REST): TPU quota limits per zone and region.

Why this API: it is the one Google documents for reading quota values (``gcloud beta quotas info list``, the
reference agent's ``get_zones_with_available_quota``). It lists each quota id once with one
``dimensionsInfos`` entry per location that has its own value, plus entries without dimensions that apply
to every other location in ``applicableLocations``. It gives limits only: usage lives in Cloud Monitoring
(``serviceruntime.googleapis.com/quota/allocation/usage``), which this controller does not read; the caller
counts usage from the TPU API's list of nodes instead (``shared.domain.quota.tpu_quota_usage``).

The caller needs ``roles/cloudquotas.viewer`` (``cloudquotas.quotas.get``) and the
``cloudquotas.googleapis.com`` service enabled; without them the API answers 403, classified here as
``ErrorClass.PERMISSION`` like every other provider error (``gcp_tpu.cloud_error_from_exception``).
"""

from __future__ import annotations

import google.api_core.exceptions as gexc
import google.api_core.retry
import google.auth.exceptions
import requests
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import cloudquotas_v1

from shared.adapters.gcp_tpu import cloud_error_from_exception
from shared.domain.quota import TPU_QUOTA_SERVICE, QuotaLimit

__all__ = ["CloudQuotas", "limits_from_info"]

_VENDOR_ERRORS = (gexc.GoogleAPIError, requests.exceptions.RequestException, google.auth.exceptions.GoogleAuthError)


def limits_from_info(info: cloudquotas_v1.QuotaInfo) -> list[QuotaLimit]:
    """One QuotaInfo -> a limit per location it names (``global`` when it names none)."""
    limits: list[QuotaLimit] = []
    for entry in info.dimensions_infos:
        dimensions = dict(entry.dimensions)
        value = int(entry.details.value)
        own = dimensions.get("zone") or dimensions.get("region")
        if own:
            limits.append(QuotaLimit(info.quota_id, own, value))
            continue
        for location in list(entry.applicable_locations) or ["global"]:
            limits.append(QuotaLimit(info.quota_id, location, value, default=True))
    return limits


class CloudQuotas:
    """Reads quota limits for one project. ``endpoint`` points the client elsewhere (the simulator, anonymous)."""

    def __init__(
        self,
        project: str,
        *,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        timeout_s: float = 20.0,
        retry_budget_s: float = 10.0,
        page_size: int = 500,
    ) -> None:
        if not project:
            raise ValueError("project: required (the GCP project id, e.g. demo-proj)")
        if retry_budget_s <= 0:
            raise ValueError("retry_budget_s: must be > 0 (seconds spent retrying a 503, e.g. 10)")
        if page_size <= 0:
            raise ValueError("page_size: must be > 0 (QuotaInfos per page, e.g. 500)")
        self.project = project
        self._endpoint = endpoint
        self._credentials = credentials if credentials is not None or endpoint is None else AnonymousCredentials()
        self._timeout_s = timeout_s
        self._page_size = page_size
        # The client's own retry waits up to 60 s on a 503; a tool answering a person gives up sooner.
        self._retry = google.api_core.retry.Retry(
            initial=0.25,
            maximum=2.0,
            multiplier=2.0,
            predicate=google.api_core.retry.if_exception_type(gexc.ServiceUnavailable),
            timeout=retry_budget_s,
        )
        self._client: cloudquotas_v1.CloudQuotasClient | None = None

    @property
    def client(self) -> cloudquotas_v1.CloudQuotasClient:
        """The google-cloud-quotas client, built on first use."""
        if self._client is None:
            options = ClientOptions(api_endpoint=self._endpoint) if self._endpoint else None
            self._client = cloudquotas_v1.CloudQuotasClient(
                transport="rest", credentials=self._credentials, client_options=options
            )
        return self._client

    def list_limits(self, service: str = TPU_QUOTA_SERVICE) -> list[QuotaLimit]:
        """Every limit of ``service``, following pages; any failure is a classified ``CloudError``."""
        parent = f"projects/{self.project}/locations/global/services/{service}"
        request = cloudquotas_v1.ListQuotaInfosRequest(parent=parent, page_size=self._page_size)
        try:
            pages = self.client.list_quota_infos(request=request, retry=self._retry, timeout=self._timeout_s)
            infos = list(pages)
        except _VENDOR_ERRORS as exc:
            raise cloud_error_from_exception(exc) from exc
        return [limit for info in infos for limit in limits_from_info(info)]

    def close(self) -> None:
        if self._client is not None:
            self._client.transport.close()
            self._client = None
