# A Cloud Scheduler job that publishes one fixed message on a topic.
#
# Scheduler is at-least-once and may fire twice; the consumers are level-triggered and take a
# lease, so a double tick is harmless. retry_count stays low because the next tick is the retry.
# The body is a complete wire message (a reconcile.tick); its attributes carry kind and purpose so
# subscription filters can route it without decoding the body.

resource "google_cloud_scheduler_job" "this" {
  project     = var.project_id
  region      = var.region
  name        = var.name
  description = var.description
  schedule    = var.schedule
  time_zone   = var.time_zone
  paused      = var.paused

  attempt_deadline = "30s"

  retry_config {
    retry_count          = var.retry_count
    min_backoff_duration = "5s"
    max_backoff_duration = "30s"
    max_doublings        = 2
  }

  pubsub_target {
    topic_name = var.topic
    data       = base64encode(jsonencode(var.message))
    attributes = var.attributes
  }

  # The controller may pause a tick job while nothing needs it and resume it later; Terraform sets
  # the state once at creation and leaves it to the controller afterwards.
  lifecycle {
    ignore_changes = [paused]
  }
}
