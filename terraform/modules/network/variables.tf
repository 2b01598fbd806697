variable "project_id" {
  description = "Project of the VPC."
  type        = string
}

variable "region" {
  description = "Region of the connector and the NAT (the functions' region)."
  type        = string
}

variable "name_prefix" {
  description = "Prefix of every resource name."
  type        = string
  default     = "tpuctl"
}

variable "network" {
  description = "Name of the existing VPC the TPU VMs join."
  type        = string
  default     = "default"
}

variable "node_tag" {
  description = "Network tag the controller puts on every TPU VM it creates; the firewall rules target it."
  type        = string
  default     = "tpuctl-node"

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.node_tag))
    error_message = "node_tag: use a network tag: lower-case letters, digits and hyphens, 1-63 characters."
  }
}

variable "vllm_port" {
  description = "TCP port vLLM (or its key-checking proxy) listens on."
  type        = number
  default     = 8000

  validation {
    condition     = var.vllm_port >= 1024 && var.vllm_port <= 65535
    error_message = "vllm_port: use an unprivileged port, 1024-65535."
  }
}

variable "vllm_source_ranges" {
  description = "CIDR ranges allowed to reach the vLLM port (the monitor's connector range, a VPN); none wider than /8 (IPv4) or /32 (IPv6). Empty: no such rule."
  type        = list(string)

  validation {
    # By prefix, not by string: 0.0.0.0/1 plus 128.0.0.0/1 is the whole Internet too. No range wider than a /8
    # (IPv4) or a /32 (IPv6) passes, so no list of them covers more than a few allocations.
    condition     = alltrue([for r in var.vllm_source_ranges : can(cidrhost(r, 0)) && try(tonumber(split("/", r)[1]) >= (strcontains(r, ":") ? 32 : 8), false)])
    error_message = "vllm_source_ranges: every entry must be a CIDR range no wider than /8 (IPv4) or /32 (IPv6); 0.0.0.0/0, 0.0.0.0/1 and the like are refused (reach vLLM through IAP or a VPN range instead)."
  }
}

variable "allow_iap_vllm" {
  description = "Allow the vLLM port on TPU VMs from Identity-Aware Proxy's TCP forwarding range only (workstation access)."
  type        = bool
  default     = true
}

variable "allow_iap_ssh" {
  description = "Allow SSH to TPU VMs from Identity-Aware Proxy's range only."
  type        = bool
  default     = true
}

variable "connector_cidr" {
  description = "Unused /28 in the VPC for the Serverless VPC Access connector the monitor uses; null creates none."
  type        = string
  default     = "10.8.0.0/28"

  validation {
    condition     = var.connector_cidr == null || can(regex("/28$", var.connector_cidr))
    error_message = "connector_cidr: Serverless VPC Access needs an unused /28 range, e.g. 10.8.0.0/28, or null."
  }
}

variable "enable_cloud_nat" {
  description = "Create Cloud NAT so TPU VMs without external IPs can pull images and weights."
  type        = bool
  default     = true
}
