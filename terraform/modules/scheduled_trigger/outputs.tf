output "job_id" {
  description = "Full job id."
  value       = google_cloud_scheduler_job.this.id
}
