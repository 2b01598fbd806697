output "project_id" {
  description = "The project id, available only once every API is enabled (consumers depend on it)."
  value       = var.project_id
  depends_on  = [google_project_service.this]
}

output "services" {
  description = "The enabled API service names."
  value       = sort(keys(google_project_service.this))
}
