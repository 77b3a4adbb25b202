"""The benchmark peers JaxPM and pmwd, each run in a process of its own."""
