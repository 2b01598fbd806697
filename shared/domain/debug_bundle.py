"""Debug bundles: what a node keeps of a sick engine before anyone restarts it, and where it is kept.

Why: a restart destroys the evidence. A hung EngineCore, a deadlocked collective or a compile that never ends
leaves nothing behind once the container is started again, so the node agent captures a bundle first (every
``serving.restart``, and on demand with ``serving.debug``): all-thread stacks of the engine's processes, the
newest log lines, a ``/metrics`` snapshot, ``tpu-info``'s output and the boot's guest attributes. It is stored
as one JSON object (:data:`BUNDLE_VERSION`) in the installation's debug-bundle bucket (a directory on the
embedded default) and linked from the node task that caused it.

The node is untrusted (it parses prompts), so the controller accepts exactly one name for a task's bundle,
:func:`bundle_object_name` of that task's own deployment and id (:func:`is_bundle_of`): a VM can neither point a
task at another deployment's bundle nor at any other object of the bucket. What a bundle holds is read as
untrusted text wherever it is shown.
"""

from __future__ import annotations

import re

__all__ = [
    "BUNDLE_PREFIX",
    "BUNDLE_VERSION",
    "MAX_BUNDLE_BYTES",
    "bundle_object_name",
    "is_bundle_of",
]

BUNDLE_PREFIX = "debug-bundles"
BUNDLE_VERSION = 1
MAX_BUNDLE_BYTES = 4 * 1024 * 1024
"""A bundle larger than this is refused by every store: stacks, 500 log lines and a metrics page fit in far less."""

_SAFE_PART = re.compile(r"^[a-z0-9][-a-z0-9]{0,62}$")


def bundle_object_name(deployment_id: str, bundle_id: str) -> str:
    """``debug-bundles/<deployment>/<bundle id>.json``: one deployment's bundles share a prefix (lifecycle, IAM).

    Raises:
        ValueError: an id holds anything but lower-case letters, digits and dashes (no path can be smuggled in).
    """
    for field, value in (("deployment_id", deployment_id), ("bundle_id", bundle_id)):
        if not _SAFE_PART.match(value):
            raise ValueError(f"{field} {value!r} is not a lower-case id of letters, digits and dashes")
    return f"{BUNDLE_PREFIX}/{deployment_id}/{bundle_id}.json"


def is_bundle_of(name: str, deployment_id: str, bundle_id: str) -> bool:
    """Whether ``name`` is the one object a node may report for this deployment's task ``bundle_id``."""
    try:
        return name == bundle_object_name(deployment_id, bundle_id)
    except ValueError:
        return False
