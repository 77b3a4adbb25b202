"""Where a campaign runs: what the Snakefile needs to plan it (workflow), SLURM site settings,
command builders and submission of job arrays (launch, submissions), and `pmpipe plan`'s table."""
