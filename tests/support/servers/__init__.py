"""Real servers the tests start: Mosquitto (open, and the shipped secure configuration), PostgreSQL, the control
plane as a process, and a host that acknowledges storage."""
