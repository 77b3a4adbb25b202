"""The process a run lives in: devices and meshes, multi-process start-up, the compilation
cache and its counters, logging, the SLURM job and the Apptainer image it runs under. Imports
nothing else of pmpipe."""
