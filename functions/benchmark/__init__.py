"""benchmark."""
