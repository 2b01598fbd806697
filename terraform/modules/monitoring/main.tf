# Alerts on the three signals that mean "a human should look":
#   1. a dead-letter subscription is not empty (a message failed every delivery attempt);
#   2. a function answers 5xx more often than transient retries explain;
#   3. the monitor logged a deployment moving to DEGRADED, STALLED or DOWN.
# (3) counts the monitor's structured log entries through a log-based metric, so the alert works
# from what the controller writes. The SLIs themselves, their dashboard and SLO-burn alerts: slo.tf.

locals {
  channels = concat(var.notification_channels, [for c in google_monitoring_notification_channel.email : c.id])

  quoted_dead_letter_subscriptions = join(", ", [for s in var.dead_letter_subscriptions : "\"${s}\""])
  quoted_function_services         = join(", ", [for s in var.function_services : "\"${s}\""])
  quoted_unhealthy_phases          = join(" OR ", [for p in var.unhealthy_phases : "\"${p}\""])
}

resource "google_monitoring_notification_channel" "email" {
  for_each = var.alert_email == null ? toset([]) : toset([var.alert_email])

  project      = var.project_id
  display_name = "tpuctl alerts (${each.value})"
  type         = "email"
  labels = {
    email_address = each.value
  }
  user_labels = var.labels
}

resource "google_monitoring_alert_policy" "dead_letter_backlog" {
  project               = var.project_id
  display_name          = "tpuctl: dead letters waiting"
  combiner              = "OR"
  notification_channels = local.channels
  user_labels           = var.labels

  conditions {
    display_name = "A dead-letter subscription holds undelivered messages"

    condition_threshold {
      filter          = "resource.type = \"pubsub_subscription\" AND metric.type = \"pubsub.googleapis.com/subscription/num_undelivered_messages\" AND resource.label.subscription_id = one_of(${local.quoted_dead_letter_subscriptions})"
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "60s"

      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = ["resource.label.subscription_id"]
      }

      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close = "86400s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      A message failed every delivery attempt and was dead-lettered. The Scheduler tick re-derives
      deployment state, so a lost command usually heals, but the message shows what failed.
      Inspect: `gcloud pubsub subscriptions pull $${resource.label.subscription_id} --limit=5`
      (without --auto-ack), read the function logs for its `command_id`, fix the cause, then
      re-publish or acknowledge it. See docs/deploy.md, "Dead letters".
    EOT
  }
}

resource "google_monitoring_alert_policy" "function_errors" {
  project               = var.project_id
  display_name          = "tpuctl: function errors"
  combiner              = "OR"
  notification_channels = local.channels
  user_labels           = var.labels

  conditions {
    display_name = "A function answered 5xx more than ${var.function_error_threshold} times in 5 minutes"

    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"run.googleapis.com/request_count\" AND metric.label.response_code_class = \"5xx\" AND resource.label.service_name = one_of(${local.quoted_function_services})"
      comparison      = "COMPARISON_GT"
      threshold_value = var.function_error_threshold
      duration        = "0s"

      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.service_name"]
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
      A tpuctl function raised more often than transient retries explain (a raise is a 5xx, and
      Pub/Sub redelivers it). Read the function's ERROR entries in Cloud Logging; repeated
      failures end in the dead-letter subscription, which has its own alert.
    EOT
  }
}

resource "google_logging_metric" "unhealthy_phase" {
  project     = var.project_id
  name        = "${var.name_prefix}/deployment_unhealthy_phase"
  description = "Monitor log entries that move a deployment to an unhealthy phase."
  filter      = "jsonPayload.kind=\"deployment.phase_changed\" AND jsonPayload.phase=(${local.quoted_unhealthy_phases})"

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = "INT64"
    unit         = "1"
    display_name = "tpuctl unhealthy phase changes"

    labels {
      key         = "phase"
      value_type  = "STRING"
      description = "The new phase."
    }

    labels {
      key         = "deployment_id"
      value_type  = "STRING"
      description = "The deployment that changed phase."
    }
  }

  label_extractors = {
    phase         = "EXTRACT(jsonPayload.phase)"
    deployment_id = "EXTRACT(jsonPayload.deployment_id)"
  }
}

resource "google_monitoring_alert_policy" "unhealthy_phase" {
  project               = var.project_id
  display_name          = "tpuctl: deployment degraded, stalled or down"
  combiner              = "OR"
  notification_channels = local.channels
  user_labels           = var.labels

  conditions {
    display_name = "The monitor moved a deployment to ${join(", ", var.unhealthy_phases)}"

    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.unhealthy_phase.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"

      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.deployment_id", "metric.label.phase"]
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
      Deployment $${metric.label.deployment_id} is $${metric.label.phase}. The controller heals on
      its own where it can (restart the container, re-provision after preemption); check
      `tpu_status(deployment_id='$${metric.label.deployment_id}')` in the gateway for its conditions
      and recent samples.
    EOT
  }
}

resource "google_logging_metric" "deployment_finding" {
  project     = var.project_id
  name        = "${var.name_prefix}/deployment_finding"
  description = "Monitor log entries that raise a finding on a deployment (saturation, an effective configuration other than the plan)."
  filter      = "jsonPayload.kind=\"deployment.finding\""

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = "INT64"
    unit         = "1"
    display_name = "tpuctl deployment findings"

    labels {
      key         = "finding"
      value_type  = "STRING"
      description = "The finding's tag: saturation, effective config."
    }

    labels {
      key         = "deployment_id"
      value_type  = "STRING"
      description = "The deployment the finding is about."
    }
  }

  label_extractors = {
    finding       = "EXTRACT(jsonPayload.finding)"
    deployment_id = "EXTRACT(jsonPayload.deployment_id)"
  }
}

resource "google_monitoring_alert_policy" "deployment_finding" {
  project               = var.project_id
  display_name          = "tpuctl: deployment finding (saturation, effective configuration)"
  combiner              = "OR"
  notification_channels = local.channels
  user_labels           = var.labels

  conditions {
    display_name = "The monitor raised a finding on a deployment"

    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.deployment_finding.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"

      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.deployment_id", "metric.label.finding"]
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
      Deployment $${metric.label.deployment_id} has a $${metric.label.finding} finding: it is short of
      room before its latency breaks (saturation), or vLLM runs another KV-cache dtype or a smaller KV pool
      than the plan (effective config). `tpu_status(deployment_id='$${metric.label.deployment_id}')`
      shows the finding with both figures.
    EOT
  }
}
