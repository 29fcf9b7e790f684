"""The device manager: device plugins (the kubelet's v1beta1 API) register, pods get their devices, containers their
device nodes, mounts, variables and CDI devices; imported only when `[devices] plugin_dir` is set."""
