"""Experts read from pinned host memory: in-place streaming, fills into cache slots, the
staging buffer, and publishing a layer's routing to the host."""
