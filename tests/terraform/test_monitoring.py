"""The Cloud Monitoring side of the SLIs: metric descriptors rendered from the Python table, the dashboard checked
against the Monitoring API's own types (google-cloud-monitoring-dashboards, unknown fields refused), and the
SLO-burn alerts reading metrics the monitor writes."""

from __future__ import annotations

import json
import re

from google.cloud import monitoring_dashboard_v1

from scripts import render_routes
from shared.domain.sli_metrics import DEPLOYMENT_LABELS, METRIC_PREFIX, descriptor_rows
from tests.support.terraform_config import TERRAFORM_ROOT, load_module

MODULE = TERRAFORM_ROOT / "modules" / "monitoring"
_METRIC_IN_FILTER = re.compile(r'metric\.type\s*=\s*\\?"(custom\.googleapis\.com/[^"\\]+)')


def _dashboard_text() -> str:
    return (MODULE / "dashboard.json").read_text(encoding="utf-8")


def test_the_checked_in_descriptors_are_the_rendering_of_the_python_table() -> None:
    assert (MODULE / "sli_metrics.json").read_text(encoding="utf-8") == render_routes.render_sli_metrics(), (
        "terraform/modules/monitoring/sli_metrics.json is stale: run python scripts/render_routes.py"
    )


def test_the_dashboard_is_a_valid_monitoring_dashboard() -> None:
    dashboard = monitoring_dashboard_v1.Dashboard.from_json(_dashboard_text())  # raises on any unknown field
    tiles = dashboard.mosaic_layout.tiles
    assert dashboard.display_name == "tpuctl: serving SLIs" and len(tiles) >= 8
    columns = dashboard.mosaic_layout.columns
    assert all(tile.x_pos + tile.width <= columns and tile.width > 0 and tile.height > 0 for tile in tiles)
    boxes = {(tile.x_pos, tile.y_pos) for tile in tiles}
    assert len(boxes) == len(tiles), "no two tiles on the same spot"


def test_the_dashboard_charts_only_metrics_the_monitor_writes_and_the_ones_that_matter() -> None:
    charted = set(_METRIC_IN_FILTER.findall(_dashboard_text()))
    written = {str(row["type"]) for row in descriptor_rows()}
    assert charted <= written, sorted(charted - written)
    wanted = {"ttft_p90_s", "itl_p90_s", "generation_tokens_per_s", "kv_cache_usage", "queue_waiting", "phase"}
    assert {METRIC_PREFIX + name for name in wanted | {"usd_per_hour"}} <= charted


def test_the_descriptors_declare_each_label_the_points_carry() -> None:
    module = load_module(MODULE)
    descriptor = module.resources_of("google_monitoring_metric_descriptor")["sli"]
    assert descriptor["metric_kind"] == "GAUGE" and descriptor["value_type"] == "DOUBLE"
    described = module.locals["label_descriptions"]
    assert set(described) == {*DEPLOYMENT_LABELS, "phase"}, "every label key has a description"
    assert "sli_metrics.json" in descriptor["for_each"] or "local.sli_metrics" in descriptor["for_each"]


def test_slo_burn_alerts_hold_ttft_and_itl_to_their_objectives_per_deployment() -> None:
    module = load_module(MODULE)
    conditions = module.locals["slo_conditions"]
    written = {str(row["name"]) for row in descriptor_rows()}
    assert {c["metric"] for c in conditions.values()} == {"ttft_p90_s", "itl_p90_s"} <= written
    policy = module.resources_of("google_monitoring_alert_policy")["slo_burn"]
    threshold = policy["conditions"][0]["condition_threshold"][0]
    assert threshold["comparison"] == "COMPARISON_GT"
    assert threshold["aggregations"][0]["group_by_fields"] == ["metric.label.deployment_id"]
    assert threshold["duration"] == "${var.slo_burn_window_s}s"
    assert policy["notification_channels"] == "${local.channels}"
    defaults = {name: module.variables[name]["default"] for name in ("ttft_p90_slo_s", "itl_p90_slo_s")}
    assert defaults == {"ttft_p90_slo_s": 2, "itl_p90_slo_s": 0.1}
    assert json.dumps(policy).count("depends_on") == 1, "created after the descriptors it reads"
