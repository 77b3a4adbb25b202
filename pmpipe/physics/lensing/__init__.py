"""Weak lensing through the lightcone planes: Born, flat-sky and full-sky ray tracing,
intrinsic alignments."""
