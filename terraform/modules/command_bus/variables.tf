variable "project_id" {
  description = "Project that owns the topics."
  type        = string
}

variable "topics" {
  description = "Message streams keyed by logical name (commands, ticks, events, node_tasks)."
  type = map(object({
    name                       = string
    message_retention_duration = optional(string)
  }))

  validation {
    condition     = alltrue([for t in values(var.topics) : can(regex("^[a-zA-Z][-a-zA-Z0-9_.~+%]{2,200}$", t.name))])
    error_message = "topics[*].name: use 3-200 characters, a letter first, then letters, digits or - _ . ~ + %."
  }
}

variable "pubsub_service_agent" {
  description = "IAM member of the project's Pub/Sub service agent (serviceAccount:service-NUMBER@gcp-sa-pubsub.iam.gserviceaccount.com)."
  type        = string

  validation {
    condition     = can(regex("^serviceAccount:service-[0-9]+@gcp-sa-pubsub\\.iam\\.gserviceaccount\\.com$", var.pubsub_service_agent))
    error_message = "pubsub_service_agent: expected serviceAccount:service-PROJECT_NUMBER@gcp-sa-pubsub.iam.gserviceaccount.com."
  }
}

variable "dead_letter_retention" {
  description = "How long an unread dead letter is kept (Pub/Sub allows up to 31 days)."
  type        = string
  default     = "604800s"
}

variable "kms_key_name" {
  description = "Optional Cloud KMS key for the topics; null keeps Google-managed encryption."
  type        = string
  default     = null
}

variable "labels" {
  description = "Labels put on every topic and subscription."
  type        = map(string)
  default     = {}
}
