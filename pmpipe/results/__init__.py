"""A campaign's results: each job's part of the summaries, their collection into the campaign
store and manifest.csv, its status, exports for training code, and the report's figures."""
