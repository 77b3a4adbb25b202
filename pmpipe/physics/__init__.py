"""The physics: pure functions of arrays and small frozen objects (the cosmology, the
:class:`~pmpipe.physics.mesh.domain.Grid`), in JAX where they run on the devices and in numpy where
configurations are checked on the host. Nothing here reads files or knows about stages."""
