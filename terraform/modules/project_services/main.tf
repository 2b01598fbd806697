# The APIs the controller uses, enabled before anything else is created.
#
# disable_on_destroy is false on purpose: turning an API off on `terraform destroy` would break
# anything else in the project that uses it, and Google keeps some resources (Firestore data,
# Artifact Registry images) alive regardless. docs/deploy.md lists what destroy leaves behind.

resource "google_project_service" "this" {
  for_each = toset(var.services)

  project                    = var.project_id
  service                    = each.value
  disable_on_destroy         = false
  disable_dependent_services = false
}
