"""The Slurm backend, and a private Slurm cluster for tests, benches and demos."""
