"""The stores: zarr v3 layout, parallel writes, completion markers, integrity manifests and
the N-body's checkpoints."""
