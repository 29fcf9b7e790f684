"""Pod sources (manifest files, an HTTP URL, the API server) merged into one stream of pod updates.

The merger is `podconfig.config`, the sources are `file` and `http`. Nothing is imported here: the config
module reads `podconfig.limits`, and reading a config (`edgelet check-config`) must not import asyncio.
"""
