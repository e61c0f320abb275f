"""The fleet's rules that need no database (read by provisioning before Django starts, e.g. bench/)."""

# What a host's container runtime setting may be: podman or docker, by name or absolute path (root runs it).
RUNTIME_PATTERN = r"(/[A-Za-z0-9._-]+)*/?(podman|docker)"
