"""Building blocks with no kubelet concept: errors, backoff, retry, tasks, checkpoints, HTTP/1.1, sd_notify."""
