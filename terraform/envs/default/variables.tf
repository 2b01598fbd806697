variable "project_id" {
  description = "Google Cloud project to deploy into (TPUCTL_PROJECT)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id: use the project id (6-30 lower-case letters, digits or hyphens), not its name or number."
  }
}

variable "region" {
  description = "Region of the functions, Scheduler jobs, connector and NAT (TPUCTL_REGION)."
  type        = string
  default     = "us-central1"
}

variable "environment" {
  description = "Environment label (env) put on every resource."
  type        = string
  default     = "default"
}

variable "name_prefix" {
  description = "Prefix of resource names (functions, accounts, subscriptions, jobs)."
  type        = string
  default     = "tpuctl"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,11}$", var.name_prefix))
    error_message = "name_prefix: use 2-12 lower-case letters, digits or hyphens, starting with a letter."
  }
}

variable "labels" {
  description = "Extra labels for every resource that takes labels."
  type        = map(string)
  default     = {}
}

variable "topic_names" {
  description = "Pub/Sub topic names; the defaults match shared/config.py (TPUCTL_TOPIC_*)."
  type = object({
    commands   = optional(string, "tpuctl-commands")
    ticks      = optional(string, "tpuctl-ticks")
    events     = optional(string, "tpuctl-events")
    node_tasks = optional(string, "tpuctl-node-tasks")
  })
  default = {}
}

variable "secret_ids" {
  description = "Secret Manager ids; the defaults match shared/config.py. Values are added out of band."
  type = object({
    hf_token     = optional(string, "tpuctl-hf-token")
    vllm_api_key = optional(string, "tpuctl-vllm-api-key")
    event_key    = optional(string, "tpuctl-event-key")
  })
  default = {}
}

variable "firestore_location" {
  description = "Firestore location; null uses var.region. Multi-regions such as nam5 are also valid."
  type        = string
  default     = null
}

variable "create_firestore_database" {
  description = "Create the (default) Firestore database; false if the project already has one."
  type        = bool
  default     = true
}

variable "function_limits" {
  description = "Per-function runtime limits, overriding the defaults (timeout 540 s, 512Mi, up to 3 instances)."
  type = map(object({
    timeout_seconds    = optional(number, 540)
    available_memory   = optional(string, "512Mi")
    max_instance_count = optional(number, 3)
  }))
  default = {}

  validation {
    condition     = alltrue([for k in keys(var.function_limits) : contains(["provision", "monitor", "benchmark"], k)])
    error_message = "function_limits: keys must be provision, monitor or benchmark."
  }
}

variable "max_delivery_attempts" {
  description = "Deliveries of one message before it is dead-lettered (5-100)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "max_delivery_attempts: Pub/Sub allows 5-100."
  }
}

variable "tick_schedules" {
  description = "unix-cron schedules of the Scheduler jobs in ticks.json (UTC)."
  type = object({
    reconcile = optional(string, "* * * * *")
    monitor   = optional(string, "* * * * *")
    janitor   = optional(string, "*/15 * * * *")
  })
  default = {}
}

variable "spot_probe" {
  description = "TPUCTL_SPOT_PROBE of the functions: probe a waiting flex-start request with a spot create that never queues (docs/deploy.md, 'The spot probe')."
  type        = bool
  default     = false
}

variable "trace_export" {
  description = "TPUCTL_TRACE_EXPORT of the functions and, through the startup script, of the node agents: where their OpenTelemetry spans go (cloud-trace or none)."
  type        = string
  default     = "cloud-trace"

  validation {
    condition     = contains(["cloud-trace", "none"], var.trace_export)
    error_message = "trace_export: cloud-trace (Cloud Trace) or none."
  }
}

variable "log_level" {
  description = "TPUCTL_LOG_LEVEL of the functions."
  type        = string
  default     = "INFO"

  validation {
    condition     = contains(["DEBUG", "INFO", "WARNING", "ERROR"], var.log_level)
    error_message = "log_level: use DEBUG, INFO, WARNING or ERROR."
  }
}

variable "gateway_principals" {
  description = "Who runs the MCP gateway (user:, group: or serviceAccount: members); they may publish commands and read state."
  type        = set(string)
  default     = []
}

variable "gateway_reads_vllm_api_key" {
  description = "Let gateway principals read the vLLM API key secret (needed for live queries to the endpoint)."
  type        = bool
  default     = true
}

variable "gateway_manages_hf_token" {
  description = "Let gateway principals read and replace the Hugging Face token (for `tpuctl token set`); off by default."
  type        = bool
  default     = false
}

variable "network" {
  description = "Existing VPC the TPU VMs join."
  type        = string
  default     = "default"
}

variable "node_tag" {
  description = "Network tag the controller must put on TPU VMs; the firewall rules target it."
  type        = string
  default     = "tpuctl-node"
}

variable "vllm_port" {
  description = "Port vLLM (or its key-checking proxy) listens on."
  type        = number
  default     = 8000
}

variable "vllm_source_ranges" {
  description = "CIDR ranges allowed to reach the vLLM port directly, besides the monitor's connector range (a VPN egress). Never 0.0.0.0/0; IAP has its own rule (allow_iap_vllm)."
  type        = list(string)
  default     = []
}

variable "allow_iap_vllm" {
  description = "Firewall rule admitting IAP's TCP forwarding range (35.235.240.0/20) to the vLLM port of TPU VMs only: how a workstation reaches vLLM (TPUCTL_ENDPOINT_ACCESS=iap)."
  type        = bool
  default     = true
}

variable "endpoint_tunnel_principals" {
  description = "Who may open IAP tunnels to the vLLM port from a workstation (user:, group: or serviceAccount: members): roles/iap.tunnelResourceAccessor limited to that port, plus the two reads gcloud and the gateway make first. Empty: no grant."
  type        = set(string)
  default     = []
}

variable "allow_iap_ssh" {
  description = "Allow SSH to TPU VMs through Identity-Aware Proxy only."
  type        = bool
  default     = true
}

variable "connector_cidr" {
  description = "Unused /28 for the Serverless VPC Access connector the monitor probes through; null disables it."
  type        = string
  default     = "10.8.0.0/28"
}

variable "enable_cloud_nat" {
  description = "Cloud NAT so TPU VMs without external IPs reach image and model registries."
  type        = bool
  default     = true
}

variable "enable_compute_engine_backend" {
  description = "Grant provision the Compute Engine permissions of the second TPU back end (ct6e VMs)."
  type        = bool
  default     = false
}

variable "enable_calendar_reservations" {
  description = "Grant provision the rights to book and release calendar-mode future reservations (tpuctlProvisionCalendar)."
  type        = bool
  default     = true
}

variable "notification_channels" {
  description = "Existing Cloud Monitoring notification channel ids the alerts go to."
  type        = list(string)
  default     = []
}

variable "alert_email" {
  description = "Optional e-mail address; creates an e-mail notification channel for the alerts."
  type        = string
  default     = null
}

variable "ttft_p90_slo_s" {
  description = "Time-to-first-token objective (p90, seconds) of the SLO-burn alert (modules/monitoring)."
  type        = number
  default     = 2
}

variable "itl_p90_slo_s" {
  description = "Inter-token latency objective (p90, seconds) of the SLO-burn alert (modules/monitoring)."
  type        = number
  default     = 0.1
}

variable "functions_source_dir" {
  description = "Folder written by `make package` (one sub-folder per function); relative paths are from this env."
  type        = string
  default     = "../../../build/functions"
}

variable "node_agent_bundle" {
  description = "Path of the node-agent bundle make package built (build/node-agent/tpuctl-node-agent-VERSION.tar.gz); uploaded under node-agent/ by content hash, and its URI and SHA-256 given to the functions. null: TPU VMs run no node agent."
  type        = string
  default     = null

  validation {
    condition     = var.node_agent_bundle == null || can(regex("\\.tar\\.gz$", var.node_agent_bundle))
    error_message = "node_agent_bundle: give the .tar.gz that make package wrote under build/node-agent/, or null."
  }
}

variable "debug_bundle_retention_days" {
  description = "Days a debug bundle (kept by a node before each engine restart, or on request) stays in its bucket."
  type        = number
  default     = 30

  validation {
    condition     = var.debug_bundle_retention_days >= 1 && var.debug_bundle_retention_days <= 365
    error_message = "debug_bundle_retention_days: use a whole number of days from 1 to 365."
  }
}

variable "weights_cache_regions" {
  description = "Regions that get a Cloud Storage cache of model weights (one Standard bucket each) TPU VMs restore from and fill. This configuration names no TPU zones (the controller picks them at run time), so null means var.region alone; list every region your deployments' zones are in (us-east5-b is in us-east5). [] creates no cache: VMs download from the Hub."
  type        = list(string)
  default     = null

  validation {
    condition     = var.weights_cache_regions == null ? true : alltrue([for region in var.weights_cache_regions : can(regex("^[a-z]+-[a-z]+[0-9]+$", region))])
    error_message = "weights_cache_regions: use region names such as us-east5 or europe-west4, not zones (us-east5-b) or multi-regions (US)."
  }
}

variable "weights_cache_max_age_days" {
  description = "Days a weights-cache object is kept after it was written; then it is deleted (a cache: the next boot that needs it fetches it from the Hub and fills it again)."
  type        = number
  default     = 60

  validation {
    condition     = var.weights_cache_max_age_days >= 1 && var.weights_cache_max_age_days <= 3650 && floor(var.weights_cache_max_age_days) == var.weights_cache_max_age_days
    error_message = "weights_cache_max_age_days: use a whole number of days from 1 to 3650."
  }
}

variable "weights_cache_cross_region" {
  description = "TPUCTL_WEIGHTS_CACHE_CROSS_REGION of the functions: a VM in a region without a cache may read another region's (egress between regions is billed per byte). Off: it downloads from the Hub instead."
  type        = bool
  default     = false
}
