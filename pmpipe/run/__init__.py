"""The run description: the pydantic models of a run and the files they are read from, the
host checks that need its physics, and the frozen setup its stages share (derive). Imports
only the physics and the runtime."""
