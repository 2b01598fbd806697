variable "project_id" {
  description = "Project of the job."
  type        = string
}

variable "region" {
  description = "Cloud Scheduler location."
  type        = string
}

variable "name" {
  description = "Job name."
  type        = string

  validation {
    condition     = can(regex("^[a-zA-Z0-9_-]{1,500}$", var.name))
    error_message = "name: use letters, digits, hyphens or underscores."
  }
}

variable "description" {
  description = "What the job is for."
  type        = string
  default     = ""
}

variable "schedule" {
  description = "unix-cron schedule, e.g. \"* * * * *\" for every minute."
  type        = string

  validation {
    condition     = length(split(" ", trimspace(var.schedule))) == 5
    error_message = "schedule: use a five-field unix-cron expression such as \"*/15 * * * *\"."
  }
}

variable "time_zone" {
  description = "Time zone of the schedule."
  type        = string
  default     = "Etc/UTC"
}

variable "paused" {
  description = "Create the job paused."
  type        = bool
  default     = false
}

variable "retry_count" {
  description = "Retries of one run (0-5); keep it low, the next run is the retry."
  type        = number
  default     = 0

  validation {
    condition     = var.retry_count >= 0 && var.retry_count <= 5
    error_message = "retry_count: Cloud Scheduler allows 0-5."
  }
}

variable "topic" {
  description = "Topic id (projects/P/topics/NAME) the job publishes to."
  type        = string
}

variable "message" {
  description = "The message body as an object; it is JSON-encoded and base64-encoded for Pub/Sub."
  type        = any
}

variable "attributes" {
  description = "Pub/Sub attributes of the published message (routing: kind, purpose)."
  type        = map(string)
  default     = {}
}
