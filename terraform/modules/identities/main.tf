# The identities that are not functions: the TPU VM's service account, the prewarm builder's and the humans (or
# groups) who run the MCP gateway. Each gets only what its job needs (docs/reference/reliability-security.md §7).
#
# TPU VM: writes logs (roles/logging.logWriter: the node agent ships the vLLM container's lines to
# Cloud Logging as the VM) and metrics, publishes results on the events topic, reads the node-agent
# bundle (and nothing else) from the source bucket, keeps debug bundles, uses the regional weights caches (weights/) and reads the compile cache (compile/). Its secret access is granted per secret by the
# secrets module. It holds no Pub/Sub right at project level and none on any topic but events: it
# reads its node tasks from its deployment's node channel, on which the controller grants it
# roles/pubsub.subscriber at run time (below, and docs/deploy.md "Who may do what").
#
# TPU builder: the identity of prewarm builder VMs (`tpuctl prewarm`) and of nothing that serves. It gets what a
# booting VM needs (its secrets, the node-agent bundle, weights/), and none of what only the node agent uses, plus the one right no serving VM has: writing the shared
# compile cache, compile/ in each weights-cache bucket (shared/domain/compile_cache.py: an entry is executable code
# every later VM loads, so trust rests on who writes it). Serving VMs parse untrusted prompts, so they only read
# compile/. The builder is never a firewall target: rules admit the vLLM port by network tag, and a builder opens no port.
#
# Gateway user: publishes commands, reads Firestore state, logs and quota limits (Cloud Quotas, for
# the live quota tpu_plan(show='zones') shows). Nothing on the TPU API: every change to TPUs goes
# through a command that the provision function validates (the live quota counts usage from Firestore
# records instead).

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

# The node agent's spans (shared/tracing.py): only when the controller exports to Cloud Trace, as the startup script
# then tells the agent to (TPUCTL_TRACE_EXPORT=cloud-trace).
resource "google_project_iam_member" "tpu_vm_trace_writer" {
  count = var.tpu_vm_writes_traces ? 1 : 0

  project = var.project_id
  role    = "roles/cloudtrace.agent"
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

# Debug bundles (shared/domain/debug_bundle.py): a VM may create objects under debug-bundles/ and nothing
# else. objectCreator cannot read, overwrite or delete, so a hostile VM can neither read another
# deployment's bundle nor change one already kept; the controller links a task only to the one name that
# task may have. The gateway's users read them (tpu_observe(show='debug_bundle')).
resource "google_storage_bucket_iam_member" "tpu_vm_debug_bundle_writer" {
  bucket = var.debug_bundle_bucket
  role   = "roles/storage.objectCreator"
  member = "serviceAccount:${google_service_account.tpu_vm.email}"

  condition {
    title       = "debug-bundles-only"
    description = "Only objects under debug-bundles/."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${var.debug_bundle_bucket}/objects/debug-bundles/\")"
  }
}

# Weights caches (shared/domain/weights_cache.py): a VM restores a model's files from its region's bucket, fills it on a
# miss and replaces a corrupt object (an ifGenerationMatch write), so objectUser on each cache bucket and nothing on any
# other. Who wrote an object does not matter: every reader hashes each file against the Hugging Face Hub's listing of
# the pinned revision, so a hostile VM can at worst empty the cache, never change what a model computes.
resource "google_storage_bucket_iam_member" "tpu_vm_weights_cache_user" {
  for_each = var.weights_cache_buckets

  bucket = each.value
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.tpu_vm.email}"

  condition {
    title       = "weights-only"
    description = "Only objects under weights/ (the VM never lists the bucket)."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/weights/\")"
  }
}

# The shared compile cache (shared/domain/compile_cache.py): a serving VM restores compiled artefacts from compile/ and
# never writes there, whatever it is made to run; objectViewer, not objectUser, so it cannot create, replace or delete
# an entry. Only the builder writes compile/ (below).
resource "google_storage_bucket_iam_member" "tpu_vm_compile_cache_reader" {
  for_each = var.weights_cache_buckets

  bucket = each.value
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.tpu_vm.email}"

  condition {
    title       = "compile-read-only"
    description = "Only objects under compile/, read only (serving VMs never write the compile cache)."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/compile/\")"
  }
}

# --- the prewarm builder --------------------------------------------------------------------------

resource "google_service_account" "tpu_builder" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-tpu-builder"
  display_name = "tpuctl TPU builder"
  description  = "Runs only on prewarm builder VMs (tpuctl prewarm): compiles once and fills the shared compile cache; never serves."
}

# A builder runs no node agent (nothing of it listens, publishes or keeps debug bundles), so of the TPU VM account's
# project rights it keeps only log writing (its boot log on the serial console and journal).
resource "google_project_iam_member" "tpu_builder" {
  for_each = toset(["roles/logging.logWriter"])

  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.tpu_builder.email}"
}

resource "google_storage_bucket_iam_member" "tpu_builder_bundle_reader" {
  bucket = var.source_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.tpu_builder.email}"

  condition {
    title       = "node-agent-bundle-only"
    description = "Only objects under node-agent/, not the function sources."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${var.source_bucket}/objects/node-agent/\")"
  }
}

# A builder boots the model like any VM (weights/ as the TPU VM account has it) ...
resource "google_storage_bucket_iam_member" "tpu_builder_weights_cache_user" {
  for_each = var.weights_cache_buckets

  bucket = each.value
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.tpu_builder.email}"

  condition {
    title       = "weights-only"
    description = "Only objects under weights/ (the VM never lists the bucket)."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/weights/\")"
  }
}

# ... and alone writes the compile cache: creates an entry's archive and manifest, replaces a manifest on its
# generation (ifGenerationMatch), deletes. Nothing outside compile/.
resource "google_storage_bucket_iam_member" "tpu_builder_compile_cache_writer" {
  for_each = var.weights_cache_buckets

  bucket = each.value
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.tpu_builder.email}"

  condition {
    title       = "compile-only"
    description = "Only objects under compile/ (the shared compile cache; only builder VMs write it)."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/compile/\")"
  }
}

# The gateway's users see what each cache holds in a plan (its state and what keeping it costs).
resource "google_storage_bucket_iam_member" "gateway_weights_cache_reader" {
  for_each = {
    for pair in setproduct(keys(var.weights_cache_buckets), tolist(var.gateway_principals)) :
    "${pair[0]} ${pair[1]}" => { bucket = var.weights_cache_buckets[pair[0]], member = pair[1] }
  }

  bucket = each.value.bucket
  role   = "roles/storage.objectViewer"
  member = each.value.member
}

resource "google_storage_bucket_iam_member" "gateway_debug_bundle_reader" {
  for_each = var.gateway_principals

  bucket = var.debug_bundle_bucket
  role   = "roles/storage.objectViewer"
  member = each.value
}

# Node channels (shared/adapters/node_channels.py). The controller opens each deployment's channel,
# the subscription tpuctl-node-<deployment> on the node-tasks topic filtered on
# attributes.deployment_id, before it creates the deployment's node; grants the TPU VM account
# roles/pubsub.subscriber on that subscription alone; and deletes it once the deployment is DELETED.
# So a VM can read its own deployment's tasks and nothing else: not another node's channel, not a
# dead-letter queue, not a push subscription of the functions.
#
# The channel appears at run time, so the managers' rights on subscriptions are project-level:
# Pub/Sub checks subscriptions.create on the project, and it recognises no resource-name IAM
# condition that could narrow delete/get/getIamPolicy/setIamPolicy to tpuctl-node-* (the resource
# attributes of IAM Conditions cover Pub/Sub Lite, not Pub/Sub). What a manager may attach to is
# narrowed: pubsub.topics.attachSubscription is bound on the node-tasks topic only, so it can
# create subscriptions there and nowhere else. The only manager is the provision function.
resource "google_project_iam_custom_role" "node_channels" {
  project     = var.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}NodeChannels"
  title       = "tpuctl node channels"
  description = "Create and delete each deployment's node-task subscription and grant its TPU VMs subscriber on it."
  permissions = [
    "pubsub.subscriptions.create",
    "pubsub.subscriptions.delete",
    "pubsub.subscriptions.get",
    "pubsub.subscriptions.getIamPolicy",
    "pubsub.subscriptions.setIamPolicy",
  ]
}

resource "google_project_iam_member" "node_channel_managers" {
  for_each = var.node_channel_managers

  project = var.project_id
  role    = google_project_iam_custom_role.node_channels.id
  member  = each.value
}

resource "google_project_iam_custom_role" "topic_attach" {
  project     = var.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}TopicAttach"
  title       = "tpuctl attach subscriptions"
  description = "Attach new subscriptions to a topic; bound on the node-tasks topic only."
  permissions = ["pubsub.topics.attachSubscription"]
}

resource "google_pubsub_topic_iam_member" "node_channel_attach" {
  for_each = var.node_channel_managers

  project = var.project_id
  topic   = var.node_tasks_topic
  role    = google_project_iam_custom_role.topic_attach.id
  member  = each.value
}

# Creating a TPU VM that runs as tpu_vm needs actAs on that one account, not project-wide.
resource "google_service_account_iam_member" "tpu_vm_users" {
  for_each = var.tpu_vm_users

  service_account_id = google_service_account.tpu_vm.name
  role               = "roles/iam.serviceAccountUser"
  member             = each.value
}

# Creating the prewarm builder VM that runs as tpu_builder: actAs on that one account too.
resource "google_service_account_iam_member" "tpu_builder_users" {
  for_each = var.tpu_builder_users

  service_account_id = google_service_account.tpu_builder.name
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
