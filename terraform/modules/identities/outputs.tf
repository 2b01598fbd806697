output "tpu_vm_email" {
  description = "Service account the controller attaches to every TPU VM."
  value       = google_service_account.tpu_vm.email
}

output "tpu_vm_member" {
  description = "The TPU VM account as an IAM member string."
  value       = "serviceAccount:${google_service_account.tpu_vm.email}"
}

output "tpu_builder_email" {
  description = "Service account the controller attaches to prewarm builder VMs only (it alone writes compile/)."
  value       = google_service_account.tpu_builder.email
}

output "tpu_builder_member" {
  description = "The TPU builder account as an IAM member string."
  value       = "serviceAccount:${google_service_account.tpu_builder.email}"
}
