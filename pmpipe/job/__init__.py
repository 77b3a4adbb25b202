"""The packed job: every stage of one or many runs in one process (pipeline), the Boltzmann
tables made ahead of them, each run's outcome, and the steps several processes agree on."""
