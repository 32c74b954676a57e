"""Apps that the rank tests launch in spawned processes."""
