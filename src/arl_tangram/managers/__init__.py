"""managers."""
