variable "project_id" {
  description = "Project of the alert policies."
  type        = string
}

variable "name_prefix" {
  description = "Prefix of the log-based metric name."
  type        = string
  default     = "tpuctl"
}

variable "notification_channels" {
  description = "Existing notification channel ids (projects/P/notificationChannels/ID) to alert."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.notification_channels : can(regex("^projects/[^/]+/notificationChannels/[0-9]+$", c))])
    error_message = "notification_channels: use full ids such as projects/my-project/notificationChannels/123 (gcloud beta monitoring channels list)."
  }
}

variable "alert_email" {
  description = "Optional e-mail address for a new notification channel, in addition to notification_channels."
  type        = string
  default     = null

  validation {
    condition     = var.alert_email == null || can(regex("^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$", var.alert_email))
    error_message = "alert_email: give an e-mail address such as oncall@example.com, or leave it null."
  }
}

variable "dead_letter_subscriptions" {
  description = "Short names of the dead-letter subscriptions to watch."
  type        = list(string)

  validation {
    condition     = length(var.dead_letter_subscriptions) > 0
    error_message = "dead_letter_subscriptions: give at least one subscription name."
  }
}

variable "function_services" {
  description = "Cloud Run service names of the functions (gen2 functions share the function's name)."
  type        = list(string)

  validation {
    condition     = length(var.function_services) > 0
    error_message = "function_services: give at least one function name."
  }
}

variable "function_error_threshold" {
  description = "5xx answers per function in 5 minutes above which to alert (a raise for retry is a 5xx too)."
  type        = number
  default     = 5
}

variable "unhealthy_phases" {
  description = "Deployment phases that page (values of shared.domain.models.Phase)."
  type        = list(string)
  default     = ["DEGRADED", "STALLED", "DOWN"]
}

variable "labels" {
  description = "User labels put on the policies and channels."
  type        = map(string)
  default     = {}
}

variable "ttft_p90_slo_s" {
  description = "Time-to-first-token objective (p90, seconds) the SLO-burn alert holds each deployment to."
  type        = number
  default     = 2

  validation {
    condition     = var.ttft_p90_slo_s > 0
    error_message = "ttft_p90_slo_s: give a positive number of seconds, e.g. 2."
  }
}

variable "itl_p90_slo_s" {
  description = "Inter-token latency objective (p90, seconds) the SLO-burn alert holds each deployment to."
  type        = number
  default     = 0.1

  validation {
    condition     = var.itl_p90_slo_s > 0
    error_message = "itl_p90_slo_s: give a positive number of seconds, e.g. 0.1."
  }
}

variable "slo_burn_window_s" {
  description = "How long (seconds) a p90 must stay above its objective before the alert fires."
  type        = number
  default     = 600

  validation {
    condition     = var.slo_burn_window_s >= 60 && var.slo_burn_window_s <= 86400
    error_message = "slo_burn_window_s: between 60 and 86400 seconds, e.g. 600."
  }
}
