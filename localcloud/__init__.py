"""localcloud."""
