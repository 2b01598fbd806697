variable "project_id" {
  description = "Project of the identities."
  type        = string
}

variable "name_prefix" {
  description = "Prefix of the service-account id."
  type        = string
  default     = "tpuctl"
}

variable "commands_topic" {
  description = "Topic id the gateway publishes commands to."
  type        = string
}

variable "events_topic" {
  description = "Topic id the TPU VM publishes results and boot reports to."
  type        = string
}

variable "node_tasks_topic" {
  description = "Topic id of the node tasks: node channels (one subscription per deployment) attach to it only."
  type        = string
}

variable "source_bucket" {
  description = "Bucket whose node-agent/ prefix the TPU VM may read."
  type        = string
}

variable "debug_bundle_bucket" {
  description = "Bucket the TPU VMs write debug bundles to (under debug-bundles/) and the gateway's users read."
  type        = string
}

variable "weights_cache_buckets" {
  description = "The regional weights-cache buckets, region -> bucket name: the TPU VM and the builder restore, fill and repair weights/ (roles/storage.objectUser); the builder alone writes compile/, which the TPU VM only reads."
  type        = map(string)
  default     = {}
}

variable "node_channel_managers" {
  description = "IAM members that open and close node channels (the provision function), keyed by a static name."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for m in values(var.node_channel_managers) : can(regex("^serviceAccount:.+", m))])
    error_message = "node_channel_managers: only service accounts (the controller's) manage node channels."
  }
}

variable "tpu_vm_writes_traces" {
  description = "Grant the TPU VM account roles/cloudtrace.agent: its node agents export spans to Cloud Trace."
  type        = bool
  default     = false
}

variable "tpu_vm_users" {
  description = "IAM members allowed to create TPU VMs that run as the TPU VM account, keyed by a static name."
  type        = map(string)
  default     = {}
}

variable "tpu_builder_users" {
  description = "IAM members allowed to create prewarm builder VMs that run as the TPU builder account, keyed by a static name."
  type        = map(string)
  default     = {}
}

variable "gateway_principals" {
  description = "Who runs the MCP gateway: user:, group: or serviceAccount: members."
  type        = set(string)
  default     = []

  validation {
    condition     = alltrue([for p in var.gateway_principals : can(regex("^(user|group|serviceAccount|principalSet|principal):.+", p))])
    error_message = "gateway_principals: use IAM members such as group:tpu-operators@example.com or user:me@example.com."
  }
}
