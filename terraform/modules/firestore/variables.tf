variable "project_id" {
  description = "Project of the database."
  type        = string
}

variable "create_database" {
  description = "Create the database; set false when the project already has it (then import or reuse it)."
  type        = bool
  default     = true
}

variable "database_id" {
  description = "Database id; \"(default)\" is what TPUCTL_FIRESTORE_DATABASE defaults to."
  type        = string
  default     = "(default)"
}

variable "location_id" {
  description = "Firestore location (a region such as us-central1, or a multi-region such as nam5)."
  type        = string
}

variable "point_in_time_recovery" {
  description = "Keep 7 days of point-in-time recovery (billed as storage)."
  type        = bool
  default     = true
}

variable "composite_indexes" {
  description = "Composite indexes keyed by a short name; field paths are the stored document fields."
  type = map(object({
    collection = string
    fields = list(object({
      field_path = string
      order      = string
    }))
  }))

  validation {
    condition     = alltrue([for i in values(var.composite_indexes) : length(i.fields) >= 2])
    error_message = "composite_indexes[*].fields: a composite index needs at least two fields (single fields are indexed automatically)."
  }

  validation {
    condition     = alltrue(flatten([for i in values(var.composite_indexes) : [for f in i.fields : contains(["ASCENDING", "DESCENDING"], f.order)]]))
    error_message = "composite_indexes[*].fields[*].order: use ASCENDING or DESCENDING."
  }
}

variable "ttl_fields" {
  description = "Timestamp fields whose value is the document's expiry, keyed by a short name."
  type = map(object({
    collection = string
    field      = string
  }))
  default = {}
}
