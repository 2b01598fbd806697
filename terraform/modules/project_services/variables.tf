variable "project_id" {
  description = "Project to enable the APIs in."
  type        = string
}

variable "services" {
  description = "API service names, e.g. pubsub.googleapis.com."
  type        = list(string)

  validation {
    condition     = alltrue([for s in var.services : can(regex("^[a-z0-9-]+\\.googleapis\\.com$", s))])
    error_message = "services: every entry must be an API service name such as pubsub.googleapis.com."
  }
}
