"""The kubelet's pod resources API (v1.PodResourcesLister): each container's devices and exclusive CPUs."""
