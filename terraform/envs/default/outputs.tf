output "gateway_environment" {
  description = "TPUCTL_* settings for the MCP gateway on an operator's machine (with their own ADC)."
  # The secret names and the node-agent bundle as the functions have them: a plan the gateway previews
  # (tpuctl plan, tpu_plan(show='startup_script')) is byte for byte the startup script the controller deploys.
  value = merge({
    TPUCTL_BACKEND             = "gcp"
    TPUCTL_PROJECT             = var.project_id
    TPUCTL_REGION              = var.region
    TPUCTL_FIRESTORE_DATABASE  = module.firestore.database
    TPUCTL_TOPIC_COMMANDS      = module.command_bus.topic_names.commands
    TPUCTL_HF_TOKEN_SECRET     = local.function_environment.TPUCTL_HF_TOKEN_SECRET
    TPUCTL_VLLM_API_KEY_SECRET = local.function_environment.TPUCTL_VLLM_API_KEY_SECRET
    # A workstation is outside the VPC: live calls go through an IAP tunnel when the firewall admits IAP.
    TPUCTL_ENDPOINT_ACCESS = var.allow_iap_vllm ? "iap" : "direct"
    # tpu_observe(show='debug_bundle') reads the bundles node agents keep here.
    TPUCTL_DEBUG_BUNDLE_BUCKET = google_storage_bucket.debug_bundles.name
    # The weights caches as the functions have them: the same startup script, and the plan's cache state.
    TPUCTL_WEIGHTS_CACHE_BUCKETS      = local.function_environment.TPUCTL_WEIGHTS_CACHE_BUCKETS
    TPUCTL_WEIGHTS_CACHE_CROSS_REGION = local.function_environment.TPUCTL_WEIGHTS_CACHE_CROSS_REGION
  }, local.node_agent_environment)
}

output "debug_bundle_bucket" {
  description = "Bucket the node agents keep debug bundles in (debug-bundles/<deployment>/<task>.json)."
  value       = google_storage_bucket.debug_bundles.name
}

output "functions" {
  description = "Function names and their runtime service accounts."
  value = {
    for name, fn in { provision = module.provision, monitor = module.monitor, benchmark = module.benchmark } :
    name => { function = fn.function_name, service_account = fn.service_account_email, subscriptions = fn.subscription_names }
  }
}

output "topics" {
  description = "Topic names by stream."
  value       = module.command_bus.topic_names
}

output "dead_letter_subscriptions" {
  description = "Where failed messages wait, by stream (alerted when non-empty)."
  value       = module.command_bus.dead_letter_subscription_names
}

output "tpu_vm_service_account" {
  description = "Service account the provision function must attach to every TPU VM it creates."
  value       = module.identities.tpu_vm_email
}

output "tpu_builder_service_account" {
  description = "Service account the provision function attaches to prewarm builder VMs only (it alone writes compile/ in the weights caches)."
  value       = module.identities.tpu_builder_email
}

output "node_network" {
  description = "What the provision function must put on TPU VMs so the firewall rules apply."
  value = {
    network   = var.network
    node_tag  = module.network.node_tag
    vllm_port = var.vllm_port
  }
}

output "sources_bucket" {
  description = "Bucket with the function sources (functions/) and the node-agent bundle (node-agent/)."
  value       = google_storage_bucket.sources.name
}

output "node_agent_bundle_uri" {
  description = "gs:// URI of the uploaded node-agent bundle, or null when none was given."
  value       = lookup(local.node_agent_environment, "TPUCTL_NODE_AGENT_BUNDLE", null)
}

output "secrets" {
  description = "Secret ids to fill out of band (gcloud secrets versions add ID --data-file=-)."
  value       = module.secrets.secret_ids
}

output "alert_policies" {
  description = "Alert policy ids by purpose."
  value       = module.monitoring.alert_policy_ids
}

output "weights_cache_buckets" {
  description = "The regional weights caches, region -> bucket (weights/models--ORG--NAME/blobs/<digest>); empty when weights_cache_regions is []."
  value       = { for region, bucket in google_storage_bucket.weights_cache : region => bucket.name }
}
