"""Campaigns: the campaign file and its expansion into runs (designs, seeds, run ids), what
each run needs (resources), the device decompositions chosen by measurement (tune,
decomposition) and the campaign's run index. Plans on the host, without JAX."""
