"""One API key per deployment, derived from the stored master key (issue #17, build item 6).

Every deployment's serving port accepts only its own key: ``HMAC-SHA256(master, b"tpuctl vllm api key v1\\x00" +
deployment_id)`` in hex. The master stays in Secret Manager (``Settings.vllm_api_key_secret``) and on each VM, where
vLLM itself is started with it behind the serving proxy; a key handed to one deployment's clients opens no other
deployment. Pure: no I/O, no logging.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["KEY_CONTEXT", "deployment_api_key"]

KEY_CONTEXT = b"tpuctl vllm api key v1\x00"
"""Domain separation: the derived key is never the HMAC of anything else keyed with the master."""


def deployment_api_key(master: str, deployment_id: str) -> str:
    """The API key of ``deployment_id``'s serving port: 64 lowercase hex characters."""
    if not master:
        raise ValueError("master: an empty vLLM API key derives nothing (set the vllm_api_key_secret secret)")
    return hmac.new(master.encode("utf-8"), KEY_CONTEXT + deployment_id.encode("utf-8"), hashlib.sha256).hexdigest()
