# Network pieces the controller relies on, in an existing VPC:
#   * a firewall rule that admits the vLLM port on TPU VMs (network tag var.node_tag) from the
#     given source ranges only, never from anywhere (none when no range is given);
#   * optionally the vLLM port from IAP's TCP forwarding range only, so a workstation reaches vLLM through
#     `gcloud compute start-iap-tunnel` (the gateway's TPUCTL_ENDPOINT_ACCESS=iap);
#   * optionally IAP-only SSH to the same VMs (for `gcloud compute tpus tpu-vm ssh --tunnel-through-iap`);
#   * a Serverless VPC Access connector so the monitor function can probe vLLM on the VMs'
#     internal addresses (TPU VMs get no external IP);
#   * Cloud NAT so those VMs can still pull the vLLM image and the model weights.

locals {
  iap_range = "35.235.240.0/20"
}

data "google_compute_network" "this" {
  project = var.project_id
  name    = var.network
}

resource "google_compute_firewall" "vllm" {
  count = length(var.vllm_source_ranges) > 0 ? 1 : 0

  project     = var.project_id
  name        = "${var.name_prefix}-allow-vllm"
  network     = data.google_compute_network.this.self_link
  description = "vLLM port on tpuctl TPU VMs, from the listed ranges only."
  direction   = "INGRESS"
  priority    = 1000

  source_ranges = var.vllm_source_ranges
  target_tags   = [var.node_tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.vllm_port)]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

# IAP TCP forwarding connects from 35.235.240.0/20 to the VM's internal address; IAM decides who may open a
# tunnel (roles/iap.tunnelResourceAccessor), this rule only lets IAP's connections reach the vLLM port.
resource "google_compute_firewall" "iap_vllm" {
  count = var.allow_iap_vllm ? 1 : 0

  project     = var.project_id
  name        = "${var.name_prefix}-allow-iap-vllm"
  network     = data.google_compute_network.this.self_link
  description = "vLLM port on tpuctl TPU VMs through Identity-Aware Proxy TCP forwarding only."
  direction   = "INGRESS"
  priority    = 1000

  source_ranges = [local.iap_range]
  target_tags   = [var.node_tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.vllm_port)]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_firewall" "iap_ssh" {
  count = var.allow_iap_ssh ? 1 : 0

  project     = var.project_id
  name        = "${var.name_prefix}-allow-iap-ssh"
  network     = data.google_compute_network.this.self_link
  description = "SSH to tpuctl TPU VMs through Identity-Aware Proxy only."
  direction   = "INGRESS"
  priority    = 1000

  source_ranges = [local.iap_range]
  target_tags   = [var.node_tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

resource "google_vpc_access_connector" "this" {
  count = var.connector_cidr == null ? 0 : 1

  project       = var.project_id
  region        = var.region
  name          = "${var.name_prefix}-conn"
  network       = data.google_compute_network.this.name
  ip_cidr_range = var.connector_cidr
  machine_type  = "e2-micro"
  min_instances = 2
  max_instances = 3
}

resource "google_compute_router" "this" {
  count = var.enable_cloud_nat ? 1 : 0

  project = var.project_id
  region  = var.region
  name    = "${var.name_prefix}-router"
  network = data.google_compute_network.this.self_link
}

resource "google_compute_router_nat" "this" {
  count = var.enable_cloud_nat ? 1 : 0

  project                            = var.project_id
  region                             = var.region
  name                               = "${var.name_prefix}-nat"
  router                             = google_compute_router.this[0].name
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}
