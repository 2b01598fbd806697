output "function_name" {
  description = "Full function name."
  value       = google_cloudfunctions2_function.this.name
}

output "uri" {
  description = "The function's Cloud Run URL (push endpoint and OIDC audience)."
  value       = google_cloudfunctions2_function.this.service_config[0].uri
}

output "service_account_email" {
  description = "Runtime identity of the function."
  value       = google_service_account.runtime.email
}

output "service_account_member" {
  description = "Runtime identity as an IAM member string."
  value       = "serviceAccount:${google_service_account.runtime.email}"
}

output "invoker_email" {
  description = "Identity Pub/Sub uses to call the function."
  value       = google_service_account.invoker.email
}

output "subscription_names" {
  description = "Push subscriptions feeding the function, by trigger key."
  value       = { for key, sub in google_pubsub_subscription.trigger : key => sub.name }
}

output "source_object" {
  description = "gs:// URI of the deployed source archive (its name is the archive's SHA-256)."
  value       = "gs://${var.source_bucket}/${google_storage_bucket_object.source.name}"
}
