"""The director's loop: the director, one iteration top to bottom, the failure path, pilot tracking."""
