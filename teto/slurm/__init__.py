"""``teto slurm provision|status|release``: Teto's agents as Slurm pilot jobs (docs/slurm.md)."""
