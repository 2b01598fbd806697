output "alert_policy_ids" {
  description = "Alert policy ids by purpose."
  value = {
    dead_letter_backlog = google_monitoring_alert_policy.dead_letter_backlog.id
    function_errors     = google_monitoring_alert_policy.function_errors.id
    unhealthy_phase     = google_monitoring_alert_policy.unhealthy_phase.id
    slo_burn_ttft       = google_monitoring_alert_policy.slo_burn["ttft"].id
    slo_burn_itl        = google_monitoring_alert_policy.slo_burn["itl"].id
  }
}

output "dashboard_id" {
  description = "The serving-SLI dashboard (Cloud Console: Monitoring, Dashboards)."
  value       = google_monitoring_dashboard.slis.id
}

output "notification_channels" {
  description = "Channels every policy notifies."
  value       = local.channels
}
