# The monitor's SLIs as custom metrics (shared/domain/sli_metrics.py, written by shared/adapters/cloud_monitoring.py):
# their descriptors, a dashboard over them, and alerts when a latency SLO is breached for long enough to burn budget.
# sli_metrics.json is rendered from the Python table (python scripts/render_routes.py); a test keeps them equal.

locals {
  sli_metrics = { for m in jsondecode(file("${path.module}/sli_metrics.json")) : m.name => m }
  label_descriptions = {
    deployment_id = "The tpuctl deployment."
    model         = "The model preset it serves."
    accelerator   = "The TPU slice type, e.g. v6e-4."
    zone          = "The zone its slice was granted in (empty before a grant)."
    tier          = "The provisioning tier: spot, flex-start, on-demand, reservation (empty before a grant)."
    phase         = "The deployment's phase (shared.domain.models.Phase)."
  }
  slo_conditions = {
    ttft = { metric = "ttft_p90_s", threshold = var.ttft_p90_slo_s, what = "time to first token" }
    itl  = { metric = "itl_p90_s", threshold = var.itl_p90_slo_s, what = "inter-token latency" }
  }
}

resource "google_monitoring_metric_descriptor" "sli" {
  for_each = local.sli_metrics

  project      = var.project_id
  type         = each.value.type
  metric_kind  = "GAUGE"
  value_type   = "DOUBLE"
  unit         = each.value.unit
  description  = each.value.description
  display_name = "tpuctl ${each.key}"

  dynamic "labels" {
    for_each = each.value.labels
    content {
      key         = labels.value
      value_type  = "STRING"
      description = local.label_descriptions[labels.value]
    }
  }
}

resource "google_monitoring_dashboard" "slis" {
  project        = var.project_id
  dashboard_json = file("${path.module}/dashboard.json")

  depends_on = [google_monitoring_metric_descriptor.sli]
}

resource "google_monitoring_alert_policy" "slo_burn" {
  for_each = local.slo_conditions

  project               = var.project_id
  display_name          = "tpuctl: ${each.value.what} p90 over its SLO"
  combiner              = "OR"
  notification_channels = local.channels
  user_labels           = var.labels

  conditions {
    display_name = "A deployment's ${each.value.what} p90 stayed above ${each.value.threshold} s for ${var.slo_burn_window_s} s"

    condition_threshold {
      filter          = "resource.type = \"global\" AND metric.type = \"${local.sli_metrics[each.value.metric].type}\""
      comparison      = "COMPARISON_GT"
      threshold_value = each.value.threshold
      duration        = "${var.slo_burn_window_s}s"

      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MEAN"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = ["metric.label.deployment_id"]
      }

      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close = "3600s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      Deployment $${metric.label.deployment_id} has served with its ${each.value.what} p90 above the
      SLO for the whole window: the error budget is burning. Look at its headroom and queue on the
      "tpuctl: serving SLIs" dashboard; `tpu_status(deployment_id='$${metric.label.deployment_id}')`
      shows its findings, and a benchmark at the SLO (`tpu_benchmark`) tells whether the slice or the
      serving flags are the limit.
    EOT
  }

  depends_on = [google_monitoring_metric_descriptor.sli]
}
