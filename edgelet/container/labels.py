"""The kubelet's label and annotation keys on CRI objects, so crictl and other tools keep working."""

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
CONTAINER_TYPE = "io.kubernetes.container.type"  # unused by CRI, kept for tools

CONTAINER_HASH = "io.kubernetes.container.hash"
CONTAINER_RESTART_COUNT = "io.kubernetes.container.restartCount"
TERMINATION_GRACE_PERIOD = "io.kubernetes.pod.terminationGracePeriod"
CONTAINER_TERMINATION_MESSAGE_PATH = "io.kubernetes.container.terminationMessagePath"
CONTAINER_TERMINATION_MESSAGE_POLICY = "io.kubernetes.container.terminationMessagePolicy"
CONTAINER_PRESTOP_HANDLER = "io.kubernetes.container.preStopHandler"
CONTAINER_PORTS = "io.kubernetes.container.ports"

# edgelet's own: which agent created the object (adoption ignores foreign sandboxes).
MANAGED_BY = "io.edgelet.managed"
