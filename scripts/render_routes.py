"""Write the data Terraform reads from Python: ``routes.json`` (push filters) and ``sli_metrics.json`` (metrics).

``terraform/envs/default/routes.json``: each push subscription's filter, rendered from the routing table.
``terraform/modules/monitoring/sli_metrics.json``: the monitor's custom metrics (``shared/domain/sli_metrics.py``),
which Terraform declares as metric descriptors; ``tests/terraform/test_monitoring.py`` checks it.

Which function receives which message kind (and which tick purpose) is stated once, in
``shared/messages/routing.py``; Terraform cannot run Python, so the filters it gives the push subscriptions are
kept here as data, ``function -> trigger -> filter`` (``""``: no filter), and ``tests/terraform/test_routes.py``
checks the file against the table. The output is deterministic (sorted keys, two-space indent, one final newline).

Usage: ``python scripts/render_routes.py`` (rewrite the file) or ``python scripts/render_routes.py --check``
(exit 1 if it is out of date).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from shared.domain.sli_metrics import descriptor_rows  # noqa: E402
from shared.messages.routing import route_filters  # noqa: E402

ROUTES_FILE = REPO_ROOT / "terraform" / "envs" / "default" / "routes.json"
SLI_METRICS_FILE = REPO_ROOT / "terraform" / "modules" / "monitoring" / "sli_metrics.json"
COMMAND = "python scripts/render_routes.py"


def render() -> str:
    """The file's text: the routing table's filters as sorted, indented JSON."""
    return json.dumps(route_filters(), indent=2, sort_keys=True) + "\n"


def render_sli_metrics() -> str:
    """``sli_metrics.json``: the metric descriptors, in the table's order."""
    return json.dumps(descriptor_rows(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is out of date; write nothing")
    args = parser.parse_args(argv)
    stale = 0
    for path, text in ((ROUTES_FILE, render()), (SLI_METRICS_FILE, render_sli_metrics())):
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            print(f"{path.relative_to(REPO_ROOT)} is out of date: run {COMMAND}", file=sys.stderr)
            stale += 1
            continue
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
