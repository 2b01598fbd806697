output "database" {
  description = "Database id the controller uses (TPUCTL_FIRESTORE_DATABASE)."
  value       = local.database
}

output "index_ids" {
  description = "Composite index ids by key."
  value       = { for key, index in google_firestore_index.this : key => index.id }
}
