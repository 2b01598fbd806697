output "connector_id" {
  description = "Serverless VPC Access connector id for the monitor, or null."
  value       = var.connector_cidr == null ? null : google_vpc_access_connector.this[0].id
}

output "network_self_link" {
  description = "Self link of the VPC."
  value       = data.google_compute_network.this.self_link
}

output "node_tag" {
  description = "Network tag TPU VMs must carry for the firewall rules to apply."
  value       = var.node_tag
}
