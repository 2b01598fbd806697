# The command bus: one topic per message stream, each with a dead-letter topic that someone reads.
#
# Pub/Sub drops a message published to a topic with no subscription, and a dead-letter topic
# nobody subscribes to is the same as no dead-letter topic. So every dead-letter topic gets a
# pull subscription that never expires and keeps messages for a week; the monitoring module
# alerts when any of them is non-empty. The Pub/Sub service agent forwards dead letters and
# needs publisher on each dead-letter topic (and subscriber on each source subscription, which
# the event_function module grants next to the subscription it creates).

locals {
  dead_letter_names = { for key, topic in var.topics : key => "${topic.name}-dead-letter" }
}

resource "google_pubsub_topic" "this" {
  #checkov:skip=CKV_GCP_83:Google-managed encryption; a customer-managed key is opt-in through var.kms_key_name.
  for_each = var.topics

  project      = var.project_id
  name         = each.value.name
  kms_key_name = var.kms_key_name
  labels       = merge(var.labels, { component = "command-bus", stream = replace(each.key, "_", "-") })

  message_retention_duration = each.value.message_retention_duration
}

resource "google_pubsub_topic" "dead_letter" {
  #checkov:skip=CKV_GCP_83:Google-managed encryption; a customer-managed key is opt-in through var.kms_key_name.
  for_each = local.dead_letter_names

  project      = var.project_id
  name         = each.value
  kms_key_name = var.kms_key_name
  labels       = merge(var.labels, { component = "dead-letter", stream = replace(each.key, "_", "-") })
}

resource "google_pubsub_subscription" "dead_letter" {
  for_each = local.dead_letter_names

  project = var.project_id
  name    = "${each.value}-sub"
  topic   = google_pubsub_topic.dead_letter[each.key].id
  labels  = merge(var.labels, { component = "dead-letter", stream = replace(each.key, "_", "-") })

  ack_deadline_seconds       = 60
  message_retention_duration = var.dead_letter_retention
  retain_acked_messages      = false

  # Subscriptions expire after 31 idle days by default; a dead-letter queue is idle by design.
  expiration_policy {
    ttl = ""
  }
}

resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  for_each = local.dead_letter_names

  project = var.project_id
  topic   = google_pubsub_topic.dead_letter[each.key].name
  role    = "roles/pubsub.publisher"
  member  = var.pubsub_service_agent
}
