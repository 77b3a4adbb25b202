"""From white noise to the final particles: ICs, LPT, the particle-mesh steps and their
schedule, time steps and the lightcone planes captured on the way."""
