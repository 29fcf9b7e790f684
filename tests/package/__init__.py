"""Package tests: build, inspect, install and boot the deb and rpm (marker `package`)."""
