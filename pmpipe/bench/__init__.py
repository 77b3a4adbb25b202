"""Benchmarks: the PM core against its peers (JaxPM, pmwd), accuracy against converged
references, whole campaigns, scaling over devices, profiler traces and the bytes a compiled
program hands to collectives. `pmpipe bench` runs them; nothing of the product imports them."""
