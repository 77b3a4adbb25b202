"""Validations of the physics against independent codes and converged references, as JSON:
`pmpipe bench steps`, `force`, `linear`, `growth`, `nonlinear`, `nuisances`, `postborn` and
`pseudo-cl`."""
