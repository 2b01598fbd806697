# The whole tpuctl footprint in one project: composed from ../../modules.
#
#   gateway ──publish──> commands ──push──> provision ──> TPU API, Firestore, events
#   Scheduler ──> ticks ──push──> provision (reconcile, janitor) / monitor (monitor)
#   TPU VM node agent ──> events ──push──> benchmark ──> Firestore, node tasks
#
# Every topic has a dead-letter topic with a subscription and an alert. Functions are fed by
# push subscriptions this configuration owns (see modules/event_function for why not Eventarc).
# Function sources come from `make package` (build/functions/NAME); run it before plan/apply.

data "google_project" "this" {
  project_id = var.project_id
}

locals {
  labels     = merge(var.labels, { "managed-by" = "tpuctl", env = var.environment })
  project_id = module.project_services.project_id

  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  functions_source_dir = startswith(var.functions_source_dir, "/") ? var.functions_source_dir : abspath("${path.module}/${var.functions_source_dir}")
  archive_dir          = "${local.functions_source_dir}/../archives"

  # Scheduler ticks: wire messages kept as data (ticks.json) so tests can check them against the
  # Python contract; the purpose attribute routes them. Job names are fixed: the provisioner finds
  # its tick job by name (shared/services/provisioner.py TICK_JOB_NAME) to pause and resume it.
  ticks = jsondecode(file("${path.module}/ticks.json"))

  topic_ids       = module.command_bus.topic_ids
  dead_letter_ids = module.command_bus.dead_letter_topic_ids

  # What shared/config.py reads. No secret values: only the secrets' names.
  function_environment = {
    TPUCTL_BACKEND             = "gcp"
    TPUCTL_PROJECT             = var.project_id
    TPUCTL_REGION              = var.region
    TPUCTL_FIRESTORE_DATABASE  = module.firestore.database
    TPUCTL_TOPIC_COMMANDS      = var.topic_names.commands
    TPUCTL_TOPIC_TICKS         = var.topic_names.ticks
    TPUCTL_TOPIC_EVENTS        = var.topic_names.events
    TPUCTL_TOPIC_NODE_TASKS    = var.topic_names.node_tasks
    TPUCTL_HF_TOKEN_SECRET     = var.secret_ids.hf_token
    TPUCTL_VLLM_API_KEY_SECRET = var.secret_ids.vllm_api_key
    TPUCTL_EVENT_KEY_SECRET    = var.secret_ids.event_key
    TPUCTL_LOG_LEVEL           = var.log_level
    TPUCTL_SPOT_PROBE          = tostring(var.spot_probe)
    TPUCTL_TRACE_EXPORT        = var.trace_export # a command's trace across the functions (shared/tracing.py)
    # Every TPU VM runs as the narrow node identity, on this VPC, with the tag the vLLM firewall rule targets,
    # and without an external IP (Cloud NAT pulls images and weights).
    TPUCTL_NODE_SERVICE_ACCOUNT = module.identities.tpu_vm_email
    TPUCTL_NODE_NETWORK         = var.network
    TPUCTL_NODE_TAGS            = module.network.node_tag
    TPUCTL_NODE_EXTERNAL_IPS    = "false"
    # Prewarm builder VMs (tpuctl prewarm) run as this account instead: it alone writes the shared compile cache.
    TPUCTL_BUILDER_SERVICE_ACCOUNT = module.identities.tpu_builder_email
    # Where node agents keep debug bundles (the VMs get it through the startup script's agent environment).
    TPUCTL_DEBUG_BUNDLE_BUCKET = google_storage_bucket.debug_bundles.name
    # The regional weights caches, region -> bucket (the startup script restores from its region's own bucket), and
    # whether a VM may read another region's (egress is billed).
    TPUCTL_WEIGHTS_CACHE_BUCKETS      = jsonencode({ for region, bucket in google_storage_bucket.weights_cache : region => bucket.name })
    TPUCTL_WEIGHTS_CACHE_CROSS_REGION = tostring(var.weights_cache_cross_region)
  }

  # The node-agent bundle every TPU VM fetches, verifies and installs at boot (docs/deploy.md); only when one is
  # given. The digest is of the file uploaded, so a VM refuses any other object under that name.
  node_agent_environment = var.node_agent_bundle == null ? tomap({}) : tomap({
    TPUCTL_NODE_AGENT_BUNDLE        = "gs://${google_storage_bucket.sources.name}/${google_storage_bucket_object.node_agent_bundle[0].name}"
    TPUCTL_NODE_AGENT_BUNDLE_SHA256 = filesha256(var.node_agent_bundle)
  })

  # Routing. Commands are ordered per deployment and go to provision, except the benchmark ones and the
  # node tasks (serving.restart, serving.logs, serving.debug), which the benchmark function dispatches to the node agent;
  # ticks go by purpose. The push subscriptions' filters are rendered from the routing table
  # (shared/messages/routing.py) into routes.json, function -> trigger -> filter ("" for none), by
  # scripts/render_routes.py; they use the subset of the Pub/Sub filter language the local bus also
  # understands (shared/adapters/_pubsub_rules.py), and tests check every message kind reaches exactly one
  # function and that routes.json matches the table.
  route_filters = jsondecode(file("${path.module}/routes.json"))

  # One weights cache per region: null is the functions' region alone, [] no cache. A name longer than Cloud Storage's
  # 63 characters (a 30-character project id, a 12-character prefix and a long region such as northamerica-northeast2)
  # keeps the prefix and the region and stands for the project id by a short hash of it.
  weights_cache_regions = distinct(var.weights_cache_regions == null ? [var.region] : var.weights_cache_regions)
  weights_cache_bucket_names = {
    for region in local.weights_cache_regions : region => (
      length("${var.project_id}-${var.name_prefix}-weights-${region}") <= 63
      ? "${var.project_id}-${var.name_prefix}-weights-${region}"
      : "${var.name_prefix}-weights-${region}-${substr(sha256(var.project_id), 0, 8)}"
    )
  }

  gateway_vllm_key_readers  = var.gateway_reads_vllm_api_key ? { for p in var.gateway_principals : "gateway ${p}" => p } : {}
  gateway_hf_token_managers = var.gateway_manages_hf_token ? { for p in var.gateway_principals : "gateway ${p}" => p } : {}
}

module "project_services" {
  source = "../../modules/project_services"

  project_id = var.project_id
  services = [
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudquotas.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
    "tpu.googleapis.com",
    "vpcaccess.googleapis.com",
  ]
}

# --- storage for function sources and the node-agent bundle --------------------------------------

resource "google_storage_bucket" "sources" {
  #checkov:skip=CKV_GCP_62:Objects are build artifacts named by content hash and written only by Terraform; access is audited by Cloud Audit Logs.
  project                     = local.project_id
  name                        = "${var.project_id}-${var.name_prefix}-sources"
  location                    = upper(var.region)
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = merge(local.labels, { component = "sources" })

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 30
    }
    action {
      type = "Delete"
    }
  }
}

# --- debug bundles: what a node keeps of a sick engine before it is restarted ----------------------------

# Written by the node agents (objectCreator under debug-bundles/ only: a VM can add a bundle but never read,
# replace or delete one), read by the gateway's users; deleted after var.debug_bundle_retention_days.
resource "google_storage_bucket" "debug_bundles" {
  #checkov:skip=CKV_GCP_62:Bundles are written once by TPU VMs and read by operators; access is audited by Cloud Audit Logs.
  project                     = local.project_id
  name                        = "${var.project_id}-${var.name_prefix}-debug-bundles"
  location                    = upper(var.region)
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = merge(local.labels, { component = "debug-bundles" })

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      age = var.debug_bundle_retention_days
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 1
    }
    action {
      type = "Delete"
    }
  }
}

# --- weights cache: model weights kept near the TPU VMs, one bucket per region ------------------------------

# A cache, not a record: the node agents restore a model's files from their region's bucket and fill it on a miss
# (shared/domain/weights_cache.py). Each object is named by the Hugging Face Hub's digest of the file and every reader
# hashes what it restores against the Hub's listing, so nothing here is trusted for its content: an object older than
# var.weights_cache_max_age_days is deleted and the next boot fetches it again. No versioning and no soft delete: a
# replaced or expired object would otherwise be billed for days after the cache let go of it.
resource "google_storage_bucket" "weights_cache" {
  #checkov:skip=CKV_GCP_62:A disposable cache whose objects every reader checks against the Hub's hashes; access is audited by Cloud Audit Logs.
  #checkov:skip=CKV_GCP_78:A cache of public digests, refilled from the Hub: old versions would only be billed, never read.
  for_each = toset(local.weights_cache_regions)

  project                     = local.project_id
  name                        = local.weights_cache_bucket_names[each.key]
  location                    = upper(each.key)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = merge(local.labels, { component = "weights-cache", region = each.key })

  soft_delete_policy {
    retention_duration_seconds = 0
  }

  lifecycle_rule {
    condition {
      age = var.weights_cache_max_age_days
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      age = 1
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }
}

# The provisioner reads the caches (the plan reports what is cached and what keeping it costs); the TPU VMs' rights are
# with the identities module's. No one else is granted anything on them.
resource "google_storage_bucket_iam_member" "provision_weights_cache_reader" {
  for_each = google_storage_bucket.weights_cache

  bucket = each.value.name
  role   = "roles/storage.objectViewer"
  member = module.provision.service_account_member
}

resource "google_storage_bucket_object" "node_agent_bundle" {
  count = var.node_agent_bundle == null ? 0 : 1

  bucket = google_storage_bucket.sources.name
  name   = "node-agent/${filesha256(var.node_agent_bundle)}-${basename(var.node_agent_bundle)}"
  source = var.node_agent_bundle
}

resource "google_artifact_registry_repository" "functions" {
  #checkov:skip=CKV_GCP_84:Images hold only the open-source controller code; Google-managed encryption applies.
  project       = local.project_id
  location      = var.region
  repository_id = "${var.name_prefix}-functions"
  description   = "Images Cloud Build makes from the tpuctl function sources."
  format        = "DOCKER"
  labels        = merge(local.labels, { component = "sources" })

  cleanup_policy_dry_run = false

  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 5
    }
  }

  cleanup_policies {
    id     = "delete-old"
    action = "DELETE"
    condition {
      older_than = "2592000s"
    }
  }
}

# Cloud Build runs as this account, not the default compute account (which may hold Editor).
resource "google_service_account" "build" {
  project      = local.project_id
  account_id   = "${var.name_prefix}-build"
  display_name = "tpuctl function builds"
  description  = "Cloud Build identity for the tpuctl functions: reads sources, pushes images, writes build logs."
}

resource "google_project_iam_member" "build_log_writer" {
  project = local.project_id
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.build.email}"
}

resource "google_artifact_registry_repository_iam_member" "build_writer" {
  project    = local.project_id
  location   = google_artifact_registry_repository.functions.location
  repository = google_artifact_registry_repository.functions.name
  role       = "roles/artifactregistry.writer"
  member     = "serviceAccount:${google_service_account.build.email}"
}

resource "google_storage_bucket_iam_member" "build_source_reader" {
  bucket = google_storage_bucket.sources.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.build.email}"

  condition {
    title       = "function-sources-only"
    description = "Only the function source archives."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.sources.name}/objects/functions/\")"
  }
}

# --- bus, state, secrets, network ---------------------------------------------------------------

module "command_bus" {
  source = "../../modules/command_bus"

  project_id           = local.project_id
  pubsub_service_agent = local.pubsub_service_agent
  labels               = local.labels
  topics = {
    commands   = { name = var.topic_names.commands }
    ticks      = { name = var.topic_names.ticks }
    events     = { name = var.topic_names.events }
    node_tasks = { name = var.topic_names.node_tasks }
  }
}

module "firestore" {
  source = "../../modules/firestore"

  project_id      = local.project_id
  create_database = var.create_firestore_database
  location_id     = coalesce(var.firestore_location, var.region)

  # Field paths as FirestoreStateStore stores them (records as native maps).
  composite_indexes = {
    deployments_by_phase = {
      collection = "deployments"
      fields = [
        { field_path = "status.phase", order = "ASCENDING" },
        { field_path = "deployment_id", order = "ASCENDING" },
      ]
    }
    samples_by_deployment = {
      collection = "samples"
      fields = [
        { field_path = "deployment_id", order = "ASCENDING" },
        { field_path = "taken_at", order = "DESCENDING" },
      ]
    }
    benchmark_runs_by_deployment = {
      collection = "benchmark_runs"
      fields = [
        { field_path = "deployment_id", order = "ASCENDING" },
        { field_path = "created_at", order = "DESCENDING" },
      ]
    }
    node_tasks_by_deployment = {
      collection = "node_tasks"
      fields = [
        { field_path = "deployment_id", order = "ASCENDING" },
        { field_path = "requested_at", order = "DESCENDING" },
      ]
    }
  }

  ttl_fields = {
    samples  = { collection = "samples", field = "expire_at" }
    commands = { collection = "commands", field = "expire_at" }
  }
}

module "secrets" {
  source = "../../modules/secrets"

  project_id = local.project_id
  labels     = local.labels
  secrets = {
    # Read at boot by the VM's host bootstrap (a serving or a prewarm builder VM) to download the gated weights. Gateway principals get
    # access only when var.gateway_manages_hf_token is set (`tpuctl token set` compares, then adds).
    hf_token = {
      secret_id = var.secret_ids.hf_token
      accessors = merge(
        { tpu_vm = module.identities.tpu_vm_member, tpu_builder = module.identities.tpu_builder_member },
        local.gateway_hf_token_managers,
      )
      version_adders = local.gateway_hf_token_managers
    }
    # The VM's proxy checks it (a builder's startup script reads it as every VM's does); the monitor sends it on
    # /v1/models probes; the gateway on live queries.
    vllm_api_key = {
      secret_id = var.secret_ids.vllm_api_key
      accessors = merge(
        {
          tpu_vm      = module.identities.tpu_vm_member
          tpu_builder = module.identities.tpu_builder_member
          monitor     = module.monitor.service_account_member
        },
        local.gateway_vllm_key_readers,
      )
    }
    # The controller key node event keys derive from (shared/domain/node_seal.py). The provision function adds
    # its first version on first use and hands each deployment's VMs their derived key in instance metadata; the
    # benchmark function checks node events with it. No VM and no person reads it.
    event_key = {
      secret_id = var.secret_ids.event_key
      accessors = {
        provision = module.provision.service_account_member
        benchmark = module.benchmark.service_account_member
      }
      version_adders = { provision = module.provision.service_account_member }
    }
  }
}

module "network" {
  source = "../../modules/network"

  project_id         = local.project_id
  region             = var.region
  name_prefix        = var.name_prefix
  network            = var.network
  node_tag           = var.node_tag
  vllm_port          = var.vllm_port
  vllm_source_ranges = distinct(concat(var.vllm_source_ranges, var.connector_cidr == null ? [] : [var.connector_cidr]))
  allow_iap_vllm     = var.allow_iap_vllm
  allow_iap_ssh      = var.allow_iap_ssh
  connector_cidr     = var.connector_cidr
  enable_cloud_nat   = var.enable_cloud_nat
}

module "identities" {
  source = "../../modules/identities"

  project_id          = local.project_id
  name_prefix         = var.name_prefix
  commands_topic      = local.topic_ids.commands
  events_topic        = local.topic_ids.events
  node_tasks_topic    = local.topic_ids.node_tasks
  source_bucket       = google_storage_bucket.sources.name
  debug_bundle_bucket = google_storage_bucket.debug_bundles.name
  # The VMs restore, fill and repair the regional weights caches (objectUser on weights/); serving VMs read compile/,
  # which only the prewarm builder writes.
  weights_cache_buckets = { for region, bucket in google_storage_bucket.weights_cache : region => bucket.name }
  gateway_principals    = var.gateway_principals
  tpu_vm_users          = { provision = module.provision.service_account_member }
  # The provisioner attaches the builder account to the prewarm builder's node.
  tpu_builder_users = { provision = module.provision.service_account_member }
  # The startup script sets TPUCTL_TRACE_EXPORT=cloud-trace for the node agents when the functions export there.
  tpu_vm_writes_traces = var.trace_export == "cloud-trace"
  # The provisioner opens each deployment's node channel and grants the TPU VM account subscriber on it.
  node_channel_managers = { provision = module.provision.service_account_member }
}

# --- functions ----------------------------------------------------------------------------------

module "provision" {
  source = "../../modules/event_function"

  project_id                  = local.project_id
  region                      = var.region
  name_prefix                 = var.name_prefix
  name                        = "provision"
  description                 = "Applies commands and reconciles deployments: queued resources, zones, tiers, teardown, janitor."
  entry_point                 = "provision"
  runtime                     = "python311"
  source_dir                  = "${local.functions_source_dir}/provision"
  archive_dir                 = local.archive_dir
  source_bucket               = google_storage_bucket.sources.name
  build_service_account_email = google_service_account.build.email
  docker_repository           = google_artifact_registry_repository.functions.id
  environment_variables       = merge(local.function_environment, local.node_agent_environment)
  pubsub_service_agent        = local.pubsub_service_agent
  labels                      = local.labels

  service = {
    timeout_seconds    = try(var.function_limits.provision.timeout_seconds, 540)
    available_memory   = try(var.function_limits.provision.available_memory, "512Mi")
    max_instance_count = try(var.function_limits.provision.max_instance_count, 3)
  }

  # Cloud TPU has no resource-level IAM, so its TPU rights are project-level: the tpuctlProvisionTpu
  # custom role below (the calls shared/adapters/gcp_tpu.py makes), not roles/tpu.admin.
  project_roles  = ["roles/datastore.user", "roles/cloudtrace.agent"]
  publish_topics = { events = local.topic_ids.events }

  triggers = {
    commands = {
      topic                   = local.topic_ids.commands
      dead_letter_topic       = local.dead_letter_ids.commands
      filter                  = local.route_filters.provision.commands
      enable_message_ordering = true
      max_delivery_attempts   = var.max_delivery_attempts
    }
    ticks = {
      topic                 = local.topic_ids.ticks
      dead_letter_topic     = local.dead_letter_ids.ticks
      filter                = local.route_filters.provision.ticks
      max_delivery_attempts = var.max_delivery_attempts
    }
  }
}

module "monitor" {
  source = "../../modules/event_function"

  project_id                  = local.project_id
  region                      = var.region
  name_prefix                 = var.name_prefix
  name                        = "monitor"
  description                 = "Probes serving deployments every tick, records samples and phases, nudges healing."
  entry_point                 = "monitor"
  runtime                     = "python311"
  source_dir                  = "${local.functions_source_dir}/monitor"
  archive_dir                 = local.archive_dir
  source_bucket               = google_storage_bucket.sources.name
  build_service_account_email = google_service_account.build.email
  docker_repository           = google_artifact_registry_repository.functions.id
  environment_variables       = merge(local.function_environment, local.node_agent_environment)
  pubsub_service_agent        = local.pubsub_service_agent
  labels                      = local.labels

  service = {
    timeout_seconds    = try(var.function_limits.monitor.timeout_seconds, 540)
    available_memory   = try(var.function_limits.monitor.available_memory, "512Mi")
    max_instance_count = try(var.function_limits.monitor.max_instance_count, 2)
    vpc_connector      = module.network.connector_id
  }

  # Publishes healing commands (serving.restart, deployment.stop/delete), reconcile nudges on ticks
  # and deployment.phase_changed events (shared/services/monitor.py).
  project_roles = ["roles/tpu.viewer", "roles/datastore.user", "roles/monitoring.metricWriter", "roles/cloudtrace.agent"]
  publish_topics = {
    commands = local.topic_ids.commands
    ticks    = local.topic_ids.ticks
    events   = local.topic_ids.events
  }

  triggers = {
    ticks = {
      topic                 = local.topic_ids.ticks
      dead_letter_topic     = local.dead_letter_ids.ticks
      filter                = local.route_filters.monitor.ticks
      max_delivery_attempts = var.max_delivery_attempts
    }
  }
}

module "benchmark" {
  source = "../../modules/event_function"

  project_id                  = local.project_id
  region                      = var.region
  name_prefix                 = var.name_prefix
  name                        = "benchmark"
  description                 = "Records benchmark runs, hands them to the node agent and stores the results it reports."
  entry_point                 = "benchmark"
  runtime                     = "python311"
  source_dir                  = "${local.functions_source_dir}/benchmark"
  archive_dir                 = local.archive_dir
  source_bucket               = google_storage_bucket.sources.name
  build_service_account_email = google_service_account.build.email
  docker_repository           = google_artifact_registry_repository.functions.id
  environment_variables       = merge(local.function_environment, local.node_agent_environment)
  pubsub_service_agent        = local.pubsub_service_agent
  labels                      = local.labels

  service = {
    timeout_seconds    = try(var.function_limits.benchmark.timeout_seconds, 300)
    available_memory   = try(var.function_limits.benchmark.available_memory, "512Mi")
    max_instance_count = try(var.function_limits.benchmark.max_instance_count, 2)
  }

  project_roles  = ["roles/datastore.user", "roles/cloudtrace.agent"]
  publish_topics = { node_tasks = local.topic_ids.node_tasks }

  triggers = {
    events = {
      topic                 = local.topic_ids.events
      dead_letter_topic     = local.dead_letter_ids.events
      filter                = local.route_filters.benchmark.events
      max_delivery_attempts = var.max_delivery_attempts
    }
    commands = {
      topic                 = local.topic_ids.commands
      dead_letter_topic     = local.dead_letter_ids.commands
      filter                = local.route_filters.benchmark.commands
      max_delivery_attempts = var.max_delivery_attempts
    }
  }
}

# --- narrowly scoped custom roles ---------------------------------------------------------------

# The provisioner's Cloud TPU calls (shared/adapters/gcp_tpu.py, v2 and v2alpha1 for flex-start), instead of
# roles/tpu.admin. Cloud TPU checks queued resources against tpu.nodes.* (roles/tpu.admin lists no
# queuedresources permission; queuedResources.reset documents tpu.nodes.reset):
#   queuedResources.create -> tpu.nodes.create      queuedResources/nodes get  -> tpu.nodes.get
#   queuedResources/nodes list -> tpu.nodes.list   queuedResources/nodes delete -> tpu.nodes.delete
#   operations.get -> tpu.operations.get           lists over locations/- -> tpu.locations.list (read-only)
# Not granted: start, stop, update, reset, reimage, maintenance and tag bindings of nodes (the provisioner
# releases a slice by deleting it), accelerator types and runtime versions (never listed).
resource "google_project_iam_custom_role" "provision_tpu" {
  project     = local.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}ProvisionTpu"
  title       = "tpuctl provision TPU"
  description = "Create, read, list and delete the controller's queued resources and TPU nodes; read operations."
  permissions = [
    "tpu.locations.list",
    "tpu.nodes.create",
    "tpu.nodes.delete",
    "tpu.nodes.get",
    "tpu.nodes.list",
    "tpu.operations.get",
  ]
}

resource "google_project_iam_member" "provision_tpu" {
  project = local.project_id
  role    = google_project_iam_custom_role.provision_tpu.id
  member  = module.provision.service_account_member
}

# Calendar-mode windows (shared/adapters/compute_calendar.py): the provisioner submits a confirmed deployment's
# future reservation, reads its procurement status, lists the deployments' zones for orphans and deletes the
# bookings nothing needs. compute.futureReservations.* cannot be scoped to names: the controller itself touches only
# tpuctl-cal-* bookings. Off (enable_calendar_reservations = false): a confirmed booking is refused for permission.
resource "google_project_iam_custom_role" "provision_calendar" {
  count = var.enable_calendar_reservations ? 1 : 0

  project     = local.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}ProvisionCalendar"
  title       = "tpuctl provision calendar-mode reservations"
  description = "Book, read, list and release the controller's calendar-mode future reservations."
  permissions = [
    "compute.futureReservations.create",
    "compute.futureReservations.delete",
    "compute.futureReservations.get",
    "compute.futureReservations.list",
    "compute.zoneOperations.get",
  ]
}

resource "google_project_iam_member" "provision_calendar" {
  count = var.enable_calendar_reservations ? 1 : 0

  project = local.project_id
  role    = google_project_iam_custom_role.provision_calendar[0].id
  member  = module.provision.service_account_member
}

# Cloud Scheduler jobs the controller manages at run time, one role per function with only the calls it makes
# (shared/adapters/cloud_scheduler.py); Scheduler has no per-job IAM, so both are project-level.
# The provisioner pauses its reconcile tick job when nothing is live, resumes (or recreates) it on the next
# command, and deletes a deleted deployment's scheduled-benchmark job: get, create, pause, enable, list, delete.
resource "google_project_iam_custom_role" "provision_scheduler_jobs" {
  project     = local.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}ProvisionSchedulerJobs"
  title       = "tpuctl provision Scheduler jobs"
  description = "Pause, resume or recreate the reconcile tick job; delete a deleted deployment's benchmark job."
  permissions = [
    "cloudscheduler.jobs.create",
    "cloudscheduler.jobs.delete",
    "cloudscheduler.jobs.enable",
    "cloudscheduler.jobs.get",
    "cloudscheduler.jobs.list",
    "cloudscheduler.jobs.pause",
  ]
}

resource "google_project_iam_member" "provision_scheduler_jobs" {
  project = local.project_id
  role    = google_project_iam_custom_role.provision_scheduler_jobs.id
  member  = module.provision.service_account_member
}

# Scheduled benchmarks (benchmark.schedule): the benchmark function creates, replaces and deletes
# tpuctl-bench-<deployment> jobs, and resumes one an operator paused when it is scheduled again; it never pauses.
resource "google_project_iam_custom_role" "benchmark_scheduler_jobs" {
  project     = local.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}BenchmarkSchedulerJobs"
  title       = "tpuctl benchmark Scheduler jobs"
  description = "Create, replace, resume and delete the scheduled-benchmark jobs."
  permissions = [
    "cloudscheduler.jobs.create",
    "cloudscheduler.jobs.delete",
    "cloudscheduler.jobs.enable",
    "cloudscheduler.jobs.get",
    "cloudscheduler.jobs.list",
    "cloudscheduler.jobs.update",
  ]
}

resource "google_project_iam_member" "benchmark_scheduler_jobs" {
  project = local.project_id
  role    = google_project_iam_custom_role.benchmark_scheduler_jobs.id
  member  = module.benchmark.service_account_member
}

# Second TPU back end (Compute Engine ct6e VMs): instance lifecycle only, off by default. These rights reach
# every instance in the project, not only the controller's: compute.instances.setMetadata could rewrite any VM's
# startup script, delete any VM. A condition on resource.name (Compute Engine supports it) cannot single ours out:
# instance names are <deployment>-g<generation>-a<attempt>, with no fixed prefix. Keep this back end in a project
# of its own, or leave it off.
resource "google_project_iam_custom_role" "compute_tpu_vms" {
  count = var.enable_compute_engine_backend ? 1 : 0

  project     = local.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}ComputeTpuVms"
  title       = "tpuctl Compute Engine TPU VMs"
  description = "Create, label, inspect and delete the TPU VMs of the Compute Engine back end."
  permissions = [
    "compute.disks.create",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setScheduling",
    "compute.instances.setServiceAccount",
    "compute.instances.setTags",
    "compute.subnetworks.use",
    "compute.zoneOperations.get",
  ]
}

resource "google_project_iam_member" "provision_compute_tpu_vms" {
  count = var.enable_compute_engine_backend ? 1 : 0

  project = local.project_id
  role    = google_project_iam_custom_role.compute_tpu_vms[0].id
  member  = module.provision.service_account_member
}

# The monitor reads the boot progress of those VMs from their guest attributes (shared/services/monitor.py); the
# adapter tells "nothing written yet" from "no such VM" (both 404) with one instances.get.
resource "google_project_iam_custom_role" "compute_guest_attributes" {
  count = var.enable_compute_engine_backend ? 1 : 0

  project     = local.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}ComputeGuestAttributes"
  title       = "tpuctl TPU VM boot progress"
  description = "Read the guest attributes (boot progress) of the Compute Engine back end's TPU VMs."
  permissions = ["compute.instances.get", "compute.instances.getGuestAttributes"]
}

resource "google_project_iam_member" "monitor_compute_guest_attributes" {
  count = var.enable_compute_engine_backend ? 1 : 0

  project = local.project_id
  role    = google_project_iam_custom_role.compute_guest_attributes[0].id
  member  = module.monitor.service_account_member
}

# Workstation access to vLLM through IAP TCP forwarding (docs/deploy.md, "Reaching a deployment from a
# workstation"). TPU VMs are created at run time, so the tunnel role is granted at project level with a
# condition that admits the vLLM port only (IAP's destination.port attribute), not SSH or any other port.
resource "google_project_iam_member" "endpoint_tunnel" {
  for_each = var.endpoint_tunnel_principals

  project = local.project_id
  role    = "roles/iap.tunnelResourceAccessor"
  member  = each.value

  condition {
    title       = "vllm-port-only"
    description = "IAP TCP forwarding to the vLLM port of tpuctl TPU VMs, nothing else."
    expression  = "destination.port == ${var.vllm_port}"
  }
}

# Before it connects, `gcloud compute start-iap-tunnel` reads the instance (compute.instances.get); for a
# Cloud TPU API node the gateway first reads the worker's hostname guest attribute (tpu.nodes.get), as
# `gcloud compute tpus tpu-vm ssh --tunnel-through-iap` does.
resource "google_project_iam_custom_role" "endpoint_tunnel" {
  count = length(var.endpoint_tunnel_principals) > 0 ? 1 : 0

  project     = local.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}EndpointTunnel"
  title       = "tpuctl endpoint tunnel lookups"
  description = "Read a TPU VM's instance and hostname to open an IAP tunnel to its vLLM port."
  permissions = ["compute.instances.get", "tpu.nodes.get"]
}

resource "google_project_iam_member" "endpoint_tunnel_lookups" {
  for_each = var.endpoint_tunnel_principals

  project = local.project_id
  role    = google_project_iam_custom_role.endpoint_tunnel[0].id
  member  = each.value
}

# --- Scheduler ticks ----------------------------------------------------------------------------

module "tick" {
  source   = "../../modules/scheduled_trigger"
  for_each = local.ticks

  project_id  = local.project_id
  region      = var.region
  name        = each.value.job
  description = each.value.description
  schedule    = var.tick_schedules[each.key]
  topic       = local.topic_ids.ticks
  message     = each.value.message
  attributes = {
    kind           = each.value.message.kind
    purpose        = each.value.message.purpose
    schema_version = each.value.message.schema_version
    command_id     = each.value.message.command_id
  }
}

# --- alerts -------------------------------------------------------------------------------------

module "monitoring" {
  source = "../../modules/monitoring"

  project_id                = local.project_id
  name_prefix               = var.name_prefix
  notification_channels     = var.notification_channels
  alert_email               = var.alert_email
  dead_letter_subscriptions = values(module.command_bus.dead_letter_subscription_names)
  function_services         = [module.provision.function_name, module.monitor.function_name, module.benchmark.function_name]
  ttft_p90_slo_s            = var.ttft_p90_slo_s
  itl_p90_slo_s             = var.itl_p90_slo_s
  labels                    = local.labels
}
