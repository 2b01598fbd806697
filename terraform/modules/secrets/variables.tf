variable "project_id" {
  description = "Project of the secrets."
  type        = string
}

variable "secrets" {
  description = "Secrets keyed by logical name (hf_token, vllm_api_key): the secret id, who may read it and who may add versions (IAM members keyed by a static name such as tpu_vm)."
  type = map(object({
    secret_id      = string
    accessors      = map(string)
    version_adders = optional(map(string), {})
  }))

  validation {
    condition     = alltrue([for s in values(var.secrets) : can(regex("^[a-zA-Z0-9_-]{1,255}$", s.secret_id))])
    error_message = "secrets[*].secret_id: use 1-255 letters, digits, hyphens or underscores."
  }

  validation {
    condition     = alltrue(flatten([for s in values(var.secrets) : [for m in values(s.accessors) : can(regex("^(serviceAccount|user|group):", m))]]))
    error_message = "secrets[*].accessors: use IAM members such as serviceAccount:NAME@PROJECT.iam.gserviceaccount.com."
  }
}

variable "labels" {
  description = "Labels put on every secret."
  type        = map(string)
  default     = {}
}
