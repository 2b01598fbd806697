output "secret_ids" {
  description = "Secret ids by logical name (the value is added out of band)."
  value       = { for key, secret in google_secret_manager_secret.this : key => secret.secret_id }
}

output "secret_names" {
  description = "Full secret resource names by logical name."
  value       = { for key, secret in google_secret_manager_secret.this : key => secret.name }
}
