"""CSI node plugins the kubelet's way: registration through the plugins_registry directory (pluginregistration v1),
the CSINode object, NodeStage/NodePublish at the kubelet's paths, and their undoing when pods go, also after a
restart. `watcher` and `drivers` are light and always loaded where a registry is configured; the gRPC client and
the volume code load when a plugin registers or a pod uses a CSI volume."""
