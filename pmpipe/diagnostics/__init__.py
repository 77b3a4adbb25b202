"""Checks of a machine and of a job's processes: `pmpipe doctor` and `pmpipe doctor --distributed`."""
