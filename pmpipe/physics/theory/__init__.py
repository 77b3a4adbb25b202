"""Cosmological theory: background, growth, linear P(k) from fits and Boltzmann codes (CAMB,
CLASS), the neutrinos' linear response and baryonic suppression."""
