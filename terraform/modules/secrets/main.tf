# Secret Manager secrets created EMPTY: the values never pass through Terraform, so they are
# never in a plan, a state file or a .tf. An operator adds the first version out of band
# (`gcloud secrets versions add NAME --data-file=-`, see docs/deploy.md).
#
# Access is granted per secret, never at project level: each accessor reads only the secrets
# listed for it, and a version adder may store a new value without being able to read any. Accessors are keyed by a static name because account emails are unknown until
# apply, and for_each keys must be known at plan time.

locals {
  accessor_bindings = merge([
    for key, secret in var.secrets : {
      for who, member in secret.accessors : "${key}/${who}" => { key = key, member = member }
    }
  ]...)
  version_adder_bindings = merge([
    for key, secret in var.secrets : {
      for who, member in secret.version_adders : "${key}/${who}" => { key = key, member = member }
    }
  ]...)
}

resource "google_secret_manager_secret" "this" {
  for_each = var.secrets

  project   = var.project_id
  secret_id = each.value.secret_id
  labels    = merge(var.labels, { component = "secrets" })

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_iam_member" "accessor" {
  for_each = local.accessor_bindings

  project   = var.project_id
  secret_id = google_secret_manager_secret.this[each.value.key].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value.member
}

resource "google_secret_manager_secret_iam_member" "version_adder" {
  for_each = local.version_adder_bindings

  project   = var.project_id
  secret_id = google_secret_manager_secret.this[each.value.key].secret_id
  role      = "roles/secretmanager.secretVersionAdder"
  member    = each.value.member
}
