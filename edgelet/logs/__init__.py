"""Container logs where collectors look: the `/var/log/containers` links to the files under pod_logs_dir."""
