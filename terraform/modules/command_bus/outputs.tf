output "topic_ids" {
  description = "Topic ids (projects/P/topics/NAME) by logical name."
  value       = { for key, topic in google_pubsub_topic.this : key => topic.id }
}

output "topic_names" {
  description = "Topic short names by logical name."
  value       = { for key, topic in google_pubsub_topic.this : key => topic.name }
}

output "dead_letter_topic_ids" {
  description = "Dead-letter topic ids by the logical name of the stream they serve."
  value       = { for key, topic in google_pubsub_topic.dead_letter : key => topic.id }
}

output "dead_letter_subscription_names" {
  description = "Short names of the subscriptions that hold each stream's dead letters."
  value       = { for key, sub in google_pubsub_subscription.dead_letter : key => sub.name }
}
