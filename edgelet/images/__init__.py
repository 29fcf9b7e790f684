"""Container images: pulls by policy with pull secrets and back-off (`manager`), the air-gap images
directory served to the runtime from a loopback registry (`airgap`, `archive`, `registry`), and image
garbage collection (`gc`)."""
