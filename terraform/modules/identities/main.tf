# The two identities that are not functions: the TPU VM's service account and the humans (or
# groups) who run the MCP gateway. Each gets only what its job needs (reliability-security.md §7).
#
# TPU VM: writes logs (roles/logging.logWriter: the node agent ships the vLLM container's lines to
# Cloud Logging as the VM) and metrics, publishes results on the events topic, reads the node-agent
# bundle (and nothing else) from the source bucket, and runs the node agent's own subscription on
# the node-tasks topic (below). Its secret access is granted per secret by the secrets module.
#
# Gateway user: publishes commands, reads Firestore state, logs and quota limits (Cloud Quotas, for
# tpu_list_zones' live quota). Nothing on the TPU API: every change to TPUs goes through a command that
# the provision function validates (the live quota counts usage from Firestore records instead).

resource "google_service_account" "tpu_vm" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-tpu-vm"
  display_name = "tpuctl TPU VM"
  description  = "Runs on every TPU VM the controller creates: node agent, vLLM bootstrap, result publishing."
}

resource "google_project_iam_member" "tpu_vm" {
  for_each = toset(["roles/logging.logWriter", "roles/monitoring.metricWriter"])

  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.tpu_vm.email}"
}

resource "google_pubsub_topic_iam_member" "tpu_vm_publisher" {
  project = var.project_id
  topic   = var.events_topic
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.tpu_vm.email}"
}

resource "google_storage_bucket_iam_member" "tpu_vm_bundle_reader" {
  bucket = var.source_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.tpu_vm.email}"

  condition {
    title       = "node-agent-bundle-only"
    description = "Only objects under node-agent/, not the function sources."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${var.source_bucket}/objects/node-agent/\")"
  }
}

# The node agent (shared/bench/node_agent.py) creates its own subscription at start,
# tpuctl-node-<deployment> filtered on attributes.deployment_id, then pulls from it. The
# subscription appears at run time, so Terraform cannot grant on it: the agent gets
# create/get/update/consume on subscriptions at project level (Pub/Sub checks create there), and
# may attach subscriptions to the node-tasks topic only, so it cannot tap the command stream.
# topics.create is there because the agent's start calls ensure_topic (a no-op on existing
# topics that still needs the permission); both go away if the controller makes the
# subscription and grants subscriber on it instead (see docs/deploy.md).
resource "google_project_iam_custom_role" "node_agent_subscriptions" {
  project     = var.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}NodeAgentSubscriptions"
  title       = "tpuctl node agent subscriptions"
  description = "Create, read, update and pull the node agent's own node-task subscription."
  permissions = [
    "pubsub.subscriptions.consume",
    "pubsub.subscriptions.create",
    "pubsub.subscriptions.get",
    "pubsub.subscriptions.update",
    "pubsub.topics.create",
  ]
}

resource "google_project_iam_custom_role" "topic_attach" {
  project     = var.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}TopicAttach"
  title       = "tpuctl attach subscriptions"
  description = "Attach new subscriptions to a topic; bound on the node-tasks topic only."
  permissions = ["pubsub.topics.attachSubscription"]
}

resource "google_project_iam_member" "tpu_vm_node_agent_subscriptions" {
  project = var.project_id
  role    = google_project_iam_custom_role.node_agent_subscriptions.id
  member  = "serviceAccount:${google_service_account.tpu_vm.email}"
}

resource "google_pubsub_topic_iam_member" "tpu_vm_attach_node_tasks" {
  project = var.project_id
  topic   = var.node_tasks_topic
  role    = google_project_iam_custom_role.topic_attach.id
  member  = "serviceAccount:${google_service_account.tpu_vm.email}"
}

# Creating a TPU VM that runs as tpu_vm needs actAs on that one account, not project-wide.
resource "google_service_account_iam_member" "tpu_vm_users" {
  for_each = var.tpu_vm_users

  service_account_id = google_service_account.tpu_vm.name
  role               = "roles/iam.serviceAccountUser"
  member             = each.value
}

locals {
  gateway_project_roles = ["roles/datastore.viewer", "roles/logging.viewer", "roles/cloudquotas.viewer"]
  gateway_project_bindings = merge([
    for principal in var.gateway_principals : {
      for role in local.gateway_project_roles : "${principal} ${role}" => { principal = principal, role = role }
    }
  ]...)
}

resource "google_project_iam_member" "gateway" {
  for_each = local.gateway_project_bindings

  project = var.project_id
  role    = each.value.role
  member  = each.value.principal
}

resource "google_pubsub_topic_iam_member" "gateway_publisher" {
  for_each = var.gateway_principals

  project = var.project_id
  topic   = var.commands_topic
  role    = "roles/pubsub.publisher"
  member  = each.value
}
