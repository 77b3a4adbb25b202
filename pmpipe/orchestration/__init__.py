"""Campaigns and their execution: designs expanded into runs, seeds, decompositions, the
Snakemake workflow's plan, SLURM command builders and submission, and the campaign's
collected results."""
