variable "project_id" {
  description = "Project that runs the function."
  type        = string
}

variable "region" {
  description = "Region of the function and its Cloud Run service."
  type        = string
}

variable "name" {
  description = "Component name (provision, monitor, benchmark); names the function, its accounts and subscriptions."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9]{2,11}$", var.name))
    error_message = "name: use 3-12 lower-case letters or digits, starting with a letter (it is part of service-account ids)."
  }
}

variable "name_prefix" {
  description = "Prefix of every resource name, e.g. tpuctl."
  type        = string
  default     = "tpuctl"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,11}$", var.name_prefix))
    error_message = "name_prefix: use 2-12 lower-case letters, digits or hyphens, starting with a letter."
  }
}

variable "description" {
  description = "What the function does, shown in the console."
  type        = string
  default     = ""
}

variable "entry_point" {
  description = "Name of the @functions_framework.cloud_event function in main.py."
  type        = string
}

variable "runtime" {
  description = "Cloud Functions runtime id."
  type        = string
  default     = "python311"

  validation {
    condition     = can(regex("^python3[0-9]+$", var.runtime))
    error_message = "runtime: use a Python runtime id such as python311."
  }
}

variable "source_dir" {
  description = "Folder assembled by `make package` (build/functions/NAME) that becomes the source archive."
  type        = string
}

variable "archive_dir" {
  description = "Where the zip of source_dir is written before upload."
  type        = string
}

variable "source_bucket" {
  description = "Bucket that holds function sources; objects are named by content hash."
  type        = string
}

variable "build_service_account_email" {
  description = "Service account Cloud Build uses to build the function image."
  type        = string
}

variable "docker_repository" {
  description = "Artifact Registry repository for the built image (projects/P/locations/R/repositories/NAME)."
  type        = string
}

variable "service" {
  description = "Runtime limits. Event work must finish well inside the Pub/Sub ack deadline."
  type = object({
    timeout_seconds                  = optional(number, 540)
    available_memory                 = optional(string, "512Mi")
    available_cpu                    = optional(string, "1")
    min_instance_count               = optional(number, 0)
    max_instance_count               = optional(number, 3)
    max_instance_request_concurrency = optional(number, 1)
    vpc_connector                    = optional(string)
    vpc_connector_egress_settings    = optional(string, "PRIVATE_RANGES_ONLY")
  })
  default = {}

  validation {
    condition     = var.service.timeout_seconds >= 10 && var.service.timeout_seconds <= 540
    error_message = "service.timeout_seconds: use 10-540 (an event must finish before the 600 s push deadline)."
  }

  validation {
    condition     = var.service.max_instance_count >= 1 && var.service.max_instance_count <= 100
    error_message = "service.max_instance_count: use 1-100; an unbounded function can run up cost and contention."
  }
}

variable "environment_variables" {
  description = "TPUCTL_* settings read by shared/config.py. Never put a secret value here."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.environment_variables) : can(regex("^TPUCTL_[A-Z0-9_]+$", k))])
    error_message = "environment_variables: only TPUCTL_* names are read by the controller (see shared/config.py)."
  }
}

variable "triggers" {
  description = "Push subscriptions that feed the function, keyed by a short name (commands, ticks, events)."
  type = map(object({
    topic                      = string # a topic id, projects/P/topics/NAME: also the push path
    dead_letter_topic          = string
    filter                     = optional(string, "")
    enable_message_ordering    = optional(bool, false)
    ack_deadline_seconds       = optional(number, 600)
    message_retention_duration = optional(string, "86400s")
    minimum_backoff            = optional(string, "10s")
    maximum_backoff            = optional(string, "600s")
    max_delivery_attempts      = optional(number, 10)
  }))

  validation {
    condition     = length(var.triggers) > 0
    error_message = "triggers: give at least one subscription, or the function never runs."
  }

  validation {
    condition     = alltrue([for t in values(var.triggers) : t.max_delivery_attempts >= 5 && t.max_delivery_attempts <= 100])
    error_message = "triggers[*].max_delivery_attempts: Pub/Sub allows 5-100."
  }

  validation {
    condition     = alltrue([for t in values(var.triggers) : t.ack_deadline_seconds >= 10 && t.ack_deadline_seconds <= 600])
    error_message = "triggers[*].ack_deadline_seconds: Pub/Sub allows 10-600 (for push it is the request timeout)."
  }

  validation {
    condition     = alltrue([for t in values(var.triggers) : length(t.filter) <= 256])
    error_message = "triggers[*].filter: Pub/Sub filters are at most 256 bytes."
  }

  validation {
    condition     = alltrue([for t in values(var.triggers) : can(regex("^projects/[^/]+/topics/[^/]+$", t.topic))])
    error_message = "triggers[*].topic: give the topic id, projects/P/topics/NAME; it is also the push path the function reads its topic from."
  }
}

variable "project_roles" {
  description = "Project-level roles for the runtime account (only where the service has no resource-level IAM)."
  type        = set(string)
  default     = []

  validation {
    condition     = length(setintersection(var.project_roles, ["roles/owner", "roles/editor", "roles/viewer"])) == 0
    error_message = "project_roles: basic roles (owner, editor, viewer) are never granted to a function."
  }
}

variable "publish_topics" {
  description = "Topics the runtime account may publish to, as topic ids keyed by logical name."
  type        = map(string)
  default     = {}
}

variable "pubsub_service_agent" {
  description = "IAM member of the project's Pub/Sub service agent."
  type        = string
}

variable "labels" {
  description = "Labels put on the function and its subscriptions."
  type        = map(string)
  default     = {}
}
