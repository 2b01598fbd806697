# One CloudEvent function (Cloud Functions gen2) fed by Pub/Sub subscriptions we own.
#
# Why no Eventarc trigger: Eventarc creates its own push subscription, and neither the Functions
# API nor google_cloudfunctions2_function exposes that subscription's dead-letter topic (see
# terraform-provider-google#25069 and #17697), so a failing event would be retried for 24 h and
# then silently discarded. Instead each trigger here is a Terraform-managed push subscription to
# the function's URL with:
#   * an OIDC token from a dedicated invoker account that holds run.invoker on this function only;
#   * a retry policy with exponential backoff (Pub/Sub redelivers on any non-2xx answer, which is
#     what functions-framework returns when the handler raises: "raise to retry, return to ack");
#   * a dead-letter policy into the stream's dead-letter topic after max_delivery_attempts;
#   * an ack deadline (the push request timeout) longer than the function timeout.
# functions-framework turns the raw Pub/Sub push body into the same CloudEvent an Eventarc
# trigger would deliver, and the @functions_framework.cloud_event decorator fixes the signature
# type, so the Python entry points are the same either way (tests/terraform checks both facts).

locals {
  function_name = "${var.name_prefix}-${var.name}"
  labels        = merge(var.labels, { component = var.name })
}

# --- identities -------------------------------------------------------------------------------

resource "google_service_account" "runtime" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-${var.name}"
  display_name = "tpuctl ${var.name} function"
  description  = "Runtime identity of the ${local.function_name} function; holds only what that function needs."
}

resource "google_service_account" "invoker" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-${var.name}-push"
  display_name = "tpuctl ${var.name} push invoker"
  description  = "Identity in the OIDC token Pub/Sub sends to ${local.function_name}; may invoke that function only."
}

resource "google_project_iam_member" "runtime" {
  for_each = var.project_roles

  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.runtime.email}"
}

resource "google_pubsub_topic_iam_member" "runtime_publisher" {
  for_each = var.publish_topics

  project = var.project_id
  topic   = each.value
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.runtime.email}"
}

# Pub/Sub mints the push OIDC token as the invoker account (needed for agents created before
# April 2021; harmless after) and nothing else may.
resource "google_service_account_iam_member" "invoker_token_creator" {
  service_account_id = google_service_account.invoker.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = var.pubsub_service_agent
}

resource "google_cloud_run_v2_service_iam_member" "invoker" {
  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.this.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.invoker.email}"
}

# --- source, named by content hash so a code change redeploys -----------------------------------

data "archive_file" "source" {
  type             = "zip"
  source_dir       = var.source_dir
  output_path      = "${var.archive_dir}/${var.name}.zip"
  output_file_mode = "0644"
}

resource "google_storage_bucket_object" "source" {
  bucket       = var.source_bucket
  name         = "functions/${var.name}/${data.archive_file.source.output_sha256}.zip"
  source       = data.archive_file.source.output_path
  content_type = "application/zip"
}

# --- the function -------------------------------------------------------------------------------

resource "google_cloudfunctions2_function" "this" {
  project     = var.project_id
  location    = var.region
  name        = local.function_name
  description = var.description
  labels      = local.labels

  build_config {
    runtime           = var.runtime
    entry_point       = var.entry_point
    service_account   = "projects/${var.project_id}/serviceAccounts/${var.build_service_account_email}"
    docker_repository = var.docker_repository

    source {
      storage_source {
        bucket = var.source_bucket
        object = google_storage_bucket_object.source.name
      }
    }
  }

  service_config {
    service_account_email            = google_service_account.runtime.email
    timeout_seconds                  = var.service.timeout_seconds
    available_memory                 = var.service.available_memory
    available_cpu                    = var.service.available_cpu
    min_instance_count               = var.service.min_instance_count
    max_instance_count               = var.service.max_instance_count
    max_instance_request_concurrency = var.service.max_instance_request_concurrency
    ingress_settings                 = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision   = true
    vpc_connector                    = var.service.vpc_connector
    vpc_connector_egress_settings    = var.service.vpc_connector == null ? null : var.service.vpc_connector_egress_settings
    environment_variables            = var.environment_variables
  }
}

# --- triggers: push subscriptions with retry and dead letters ------------------------------------

resource "google_pubsub_subscription" "trigger" {
  for_each = var.triggers

  project = var.project_id
  name    = "${local.function_name}-${replace(each.key, "_", "-")}"
  topic   = each.value.topic
  filter  = each.value.filter
  labels  = local.labels

  enable_message_ordering    = each.value.enable_message_ordering
  ack_deadline_seconds       = each.value.ack_deadline_seconds
  message_retention_duration = each.value.message_retention_duration

  # The push path names the topic (functions-framework turns /projects/P/topics/T into the CloudEvent's
  # source): the function knows which topic delivered a message from Pub/Sub, never from what a publisher
  # set, and refuses kinds that may not travel on it (shared/messages/routing.py).
  push_config {
    push_endpoint = "${google_cloudfunctions2_function.this.service_config[0].uri}/${each.value.topic}"

    oidc_token {
      service_account_email = google_service_account.invoker.email
      audience              = google_cloudfunctions2_function.this.service_config[0].uri
    }
  }

  retry_policy {
    minimum_backoff = each.value.minimum_backoff
    maximum_backoff = each.value.maximum_backoff
  }

  dead_letter_policy {
    dead_letter_topic     = each.value.dead_letter_topic
    max_delivery_attempts = each.value.max_delivery_attempts
  }

  expiration_policy {
    ttl = ""
  }

  depends_on = [google_cloud_run_v2_service_iam_member.invoker]
}

# The service agent must be able to take a message off the subscription to dead-letter it.
resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  for_each = var.triggers

  project      = var.project_id
  subscription = google_pubsub_subscription.trigger[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = var.pubsub_service_agent
}
