"""The cAdvisor series of the kubelet's /metrics/cadvisor, from CRI stats and the pods' cgroups, made on scrape."""
