"""Statistics of fields and maps: P(k), peaks, PDF, pseudo-C_ℓ of masked skies, shear
correlations, and the ranges a run resolves."""
