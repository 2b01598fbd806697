# Firestore (native mode): the controller's state, with the composite indexes its queries need
# and TTL policies so the command ledger and monitor samples clean themselves up.
#
# The database is never deleted by Terraform: delete protection is on and deletion_policy is
# ABANDON, so `terraform destroy` only forgets it (docs/deploy.md explains how to remove it).

resource "google_firestore_database" "this" {
  count = var.create_database ? 1 : 0

  project                           = var.project_id
  name                              = var.database_id
  location_id                       = var.location_id
  type                              = "FIRESTORE_NATIVE"
  concurrency_mode                  = "PESSIMISTIC"
  app_engine_integration_mode       = "DISABLED"
  point_in_time_recovery_enablement = var.point_in_time_recovery ? "POINT_IN_TIME_RECOVERY_ENABLED" : "POINT_IN_TIME_RECOVERY_DISABLED"
  delete_protection_state           = "DELETE_PROTECTION_ENABLED"
  deletion_policy                   = "ABANDON"
}

locals {
  database = var.create_database ? google_firestore_database.this[0].name : var.database_id
}

resource "google_firestore_index" "this" {
  for_each = var.composite_indexes

  project     = var.project_id
  database    = local.database
  collection  = each.value.collection
  query_scope = "COLLECTION"

  dynamic "fields" {
    for_each = each.value.fields
    content {
      field_path = fields.value.field_path
      order      = fields.value.order
    }
  }
}

# TTL deletes a document some time (typically within a day) after its timestamp passes. The
# field keeps its automatic single-field index (no index_config block): the store's
# purge_expired() queries expire_at < now for an immediate clean-up.
resource "google_firestore_field" "ttl" {
  for_each = var.ttl_fields

  project    = var.project_id
  database   = local.database
  collection = each.value.collection
  field      = each.value.field

  ttl_config {}
}
