"""Write ``terraform/envs/default/routes.json``: each push subscription's filter, rendered from the routing table.

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

from shared.messages.routing import route_filters  # noqa: E402

ROUTES_FILE = REPO_ROOT / "terraform" / "envs" / "default" / "routes.json"
COMMAND = "python scripts/render_routes.py"


def render() -> str:
    """The file's text: the routing table's filters as sorted, indented JSON."""
    return json.dumps(route_filters(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if routes.json is out of date; write nothing")
    args = parser.parse_args(argv)
    text = render()
    current = ROUTES_FILE.read_text(encoding="utf-8") if ROUTES_FILE.exists() else None
    if args.check:
        if current != text:
            print(f"{ROUTES_FILE.relative_to(REPO_ROOT)} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if current != text:
        ROUTES_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {ROUTES_FILE.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
