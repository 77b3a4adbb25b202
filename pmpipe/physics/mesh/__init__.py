"""The sharded mesh: the particle grid and force mesh split over devices (domain), FFTs and
cloud-in-cell painting."""
