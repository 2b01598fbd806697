output "alert_policy_ids" {
  description = "Alert policy ids by purpose."
  value = {
    dead_letter_backlog = google_monitoring_alert_policy.dead_letter_backlog.id
    function_errors     = google_monitoring_alert_policy.function_errors.id
    unhealthy_phase     = google_monitoring_alert_policy.unhealthy_phase.id
  }
}

output "notification_channels" {
  description = "Channels every policy notifies."
  value       = local.channels
}
