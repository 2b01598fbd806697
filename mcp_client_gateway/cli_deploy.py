"""``tpuctl deploy``'s arguments (kept apart from ``cli.py``, its size), including the calendar-mode booking."""

from __future__ import annotations

import argparse

from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, Tier

__all__ = ["add_deploy_arguments"]

_ALTERNATIVE = "a slice to step down or across to when the first is scarce (repeat, in order); must fit"
_PRESET = "a tune run's id (tpuctl tune): serve with the flags it verified on this model and slice"
_BOOK = "book the earliest calendar-mode window (tpuctl plan shows it and its price; asks for confirmation)"


PREWARM_HELP = (
    "fill the region's compile cache for a deployment's plan: a builder boots, compiles, uploads and is deleted "
    "(priced in tpuctl plan; later boots of the same plan and slice start warm)"
)


def add_deploy_arguments(deploy: argparse.ArgumentParser) -> None:
    deploy.add_argument("deployment_id")
    deploy.add_argument("--model", required=True, choices=MODEL_PRESET_NAMES)
    deploy.add_argument("--accelerator", default="v6e-4", choices=ACCELERATOR_TYPES)
    deploy.add_argument("--alternative-accelerator", action="append", choices=ACCELERATOR_TYPES, help=_ALTERNATIVE)
    deploy.add_argument("--zone", action="append", help="allowed zone, best first (repeat); default: quota fits")
    tiers = tuple(tier.value for tier in Tier)
    deploy.add_argument("--tier", action="append", choices=tiers, help="capacity tier in priority order (repeat)")
    deploy.add_argument("--hedge", type=int)
    deploy.add_argument("--ttl-hours", type=float)
    deploy.add_argument("--budget-usd", type=float)
    deploy.add_argument("--idle-minutes", type=int)
    deploy.add_argument("--max-model-len", type=int)
    deploy.add_argument("--kv-cache-dtype", choices=("auto", "fp8"))
    deploy.add_argument("--dtype", choices=("bfloat16", "fp8"), help="weight dtype (default bfloat16)")
    deploy.add_argument("--command-id", help="idempotency key (UUID) to retry safely")
    deploy.add_argument("--preset", metavar="RUN", help=_PRESET)
    deploy.add_argument("--book-calendar", action="store_true", help=_BOOK)
    deploy.add_argument("--prewarm", action="store_true", help=f"{PREWARM_HELP}; the same as tpuctl prewarm")
    deploy.add_argument("--yes", "-y", action="store_true", help="confirm a booking without a prompt")
    deploy.add_argument("--confirm", metavar="NAME", help="confirm a booking by naming the deployment")
